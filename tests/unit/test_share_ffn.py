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
    score = torch.zeros(width, dtype=torch.float64)
    score[[9, 2, 5]] = torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64)  # topk gives them as 9, 5, 2
    keep = [2, 5, 9]
    originals = [(first.weight[keep].clone(), second.weight[:, keep].clone()) for first, second in pairs]

    prune_ffn(model, 3, [score] * len(pairs))

    for (first, second), (w_in, w_out) in zip(ffn_linears(model)[0], originals, strict=True):
        assert torch.equal(first.weight, w_in) and torch.equal(second.weight, w_out)


def test_bad_sizes_and_models_are_refused(tiny_bert_dir: Path):
    model, _ = load_classifier(tiny_bert_dir)
    width = model.config.intermediate_size
    scores = [torch.ones(width, dtype=torch.float64)] * model.config.num_hidden_layers
    for size in (0, width, width + 1):
        refused = rf"share\.ffn: {size} must be between 1 and {width - 1} \(the feed-forward width is"
        with pytest.raises(RecipeError, match=refused):
            prune_ffn(model, size, scores)
    with pytest.raises(ModelError, match="has no encoder layer list"):
        ffn_linears(torch.nn.Linear(2, 2))


def test_a_model_whose_feed_forward_blocks_are_tied_is_refused(tiny_bert_dir: Path):
    from compress.share.tying import make_plan, tie_layers

    model, _ = load_classifier(tiny_bert_dir)
    tie_layers(model, make_plan("ffn", model.config.num_hidden_layers), init="mean")
    with pytest.raises(ModelError, match=r"tied by an earlier share stage; put ffn: N in that stage"):
        ffn_linears(model)
    relaxed, _ = load_classifier(tiny_bert_dir)
    tie_layers(relaxed, make_plan("all", relaxed.config.num_hidden_layers, relax_rank=2), init="mean")
    with pytest.raises(ModelError, match="prune before tying layers"):
        ffn_linears(relaxed)


def test_distilbert_blocks_prune_and_reload(tmp_path: Path):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=40, dim=16, n_layers=2, n_heads=2, hidden_dim=32, num_labels=2)
    model = DistilBertForSequenceClassification(config).eval()
    ids = torch.randint(5, 40, (2, 7))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        for _, second in ffn_linears(model)[0]:
            second.weight[:, 16:] = 0  # half the neurons add nothing
    before = _logits(model, batch)

    record = prune_ffn(model, 16, neuron_importance(model, [batch]))

    assert record["energy_kept"] == [1.0, 1.0] and model.config.hidden_dim == 16
    torch.testing.assert_close(_logits(model, batch), before, rtol=1e-5, atol=1e-5)
    model.save_pretrained(str(tmp_path / "pruned"))
    loaded = DistilBertForSequenceClassification.from_pretrained(str(tmp_path / "pruned"))
    torch.testing.assert_close(_logits(loaded, batch), before, rtol=1e-5, atol=1e-5)
