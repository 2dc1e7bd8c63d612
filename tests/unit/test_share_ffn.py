"""Feed-forward width pruning: the ranking measures what each neuron adds, the pruned model is a plain
checkpoint, and dropping nothing that matters leaves the outputs as they were."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compress.errors import ModelError, RecipeError
from compress.models import load_classifier
from compress.share.ffn import ffn_linears, neuron_importance, prune_ffn
from compress.share.model import parameter_stats, save_shared_checkpoint

TEXTS = ["a great film", "the plot was dull and the acting was worse", "fine"]


def _batch(tokenizer) -> dict[str, torch.Tensor]:
    return dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))


def _logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(**batch).logits


def test_importance_is_the_output_energy_each_neuron_adds(tiny_bert_dir: Path):
    model, tokenizer = load_classifier(tiny_bert_dir)
    batch = _batch(tokenizer)
    first, second = ffn_linears(model)[0][0]
    captured: list[torch.Tensor] = []
    handle = second.register_forward_pre_hook(lambda _m, inputs: captured.append(inputs[0].detach()))
    _logits(model, batch)
    handle.remove()
    mask = batch["attention_mask"].bool()
    real = captured[0][mask].double()  # (real tokens, I): padding positions never count
    expected = (real**2).mean(dim=0) * second.weight.double().pow(2).sum(dim=0)

    scores = neuron_importance(model, [batch])

    assert len(scores) == model.config.num_hidden_layers
    torch.testing.assert_close(scores[0], expected)
    assert first.out_features == second.in_features == scores[0].numel()


def test_neurons_that_add_nothing_go_first_and_the_outputs_stay(tiny_bert_dir: Path, tmp_path: Path):
    model, tokenizer = load_classifier(tiny_bert_dir)
    batch = _batch(tokenizer)
    width = model.config.intermediate_size
    dead = torch.arange(0, width, 4)  # silence a quarter of every layer's neurons
    with torch.no_grad():
        for _, second in ffn_linears(model)[0]:
            second.weight[:, dead] = 0
    before = _logits(model, batch)
    params = parameter_stats(model)["parameters"]
    layers = model.config.num_hidden_layers
    hidden = model.config.hidden_size

    record = prune_ffn(model, width - len(dead), neuron_importance(model, [batch]))

    assert record["ffn_before"] == width and record["ffn_after"] == width - len(dead)
    assert record["energy_kept"] == [1.0] * layers
    assert model.config.intermediate_size == width - len(dead)
    # each layer loses a row (weight + bias) of the first linear and a column of the second
    assert parameter_stats(model)["parameters"] == params - layers * len(dead) * (2 * hidden + 1)
    torch.testing.assert_close(_logits(model, batch), before, rtol=1e-5, atol=1e-5)
    save_shared_checkpoint(model, tokenizer, tmp_path / "pruned")
    loaded, _ = load_classifier(tmp_path / "pruned")  # a plain Hugging Face checkpoint
    assert loaded.config.intermediate_size == width - len(dead)
    torch.testing.assert_close(_logits(loaded, batch), before, rtol=1e-5, atol=1e-5)


def test_pruning_keeps_the_strongest_neurons_in_their_order(tiny_bert_dir: Path):
    model, _ = load_classifier(tiny_bert_dir)
    pairs, _ = ffn_linears(model)
    width = pairs[0][1].in_features
    scores = [torch.arange(width, dtype=torch.float64).flip(0) for _ in pairs]  # neuron 0 matters most
    originals = [(first.weight[:3].clone(), second.weight[:, :3].clone()) for first, second in pairs]

    prune_ffn(model, 3, scores)

    for (first, second), (w_in, w_out) in zip(ffn_linears(model)[0], originals, strict=True):
        assert torch.equal(first.weight, w_in) and torch.equal(second.weight, w_out)


def test_bad_sizes_and_models_are_refused(tiny_bert_dir: Path):
    model, _ = load_classifier(tiny_bert_dir)
    width = model.config.intermediate_size
    scores = [torch.ones(width, dtype=torch.float64)] * model.config.num_hidden_layers
    for size in (0, width, width + 1):
        with pytest.raises(RecipeError, match=rf"share\.ffn: {size} must be between 1 and .* {width - 1}"):
            prune_ffn(model, size, scores)
    with pytest.raises(ModelError, match=r"share\.ffn supports BERT-family encoders"):
        ffn_linears(torch.nn.Linear(2, 2))
