"""Cross-layer sharing: ties are one tensor, stay tied through training and save/load, bad groups fail."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
import torch

from compress.errors import RecipeError
from compress.models import load_classifier
from compress.share.model import (
    load_shared_classifier,
    parameter_stats,
    save_shared_checkpoint,
    set_sharing_spec,
)
from compress.share.tying import encoder_layers, make_plan, tie_layers
from tests.helpers.tiny import make_tiny_bert


@pytest.fixture(scope="module")
def four_layer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny4"), layers=4)


def _tied(model, plan_mode: str, groups=None, init="mean"):
    plan = make_plan(plan_mode, len(encoder_layers(model)), groups)
    tie_layers(model, plan, init=init)
    set_sharing_spec(model, layers=plan.to_json())
    return plan


def _batch(tokenizer):
    return tokenizer(["the film was great", "a bad meal"], padding=True, return_tensors="pt")


def test_mode_all_leaves_one_layer_and_one_tensor_per_weight(four_layer_dir: Path):
    model, _ = load_classifier(four_layer_dir)
    before = parameter_stats(model)
    one_layer = sum(p.numel() for p in encoder_layers(model)[0].parameters())
    _tied(model, "all")
    layers = encoder_layers(model)
    assert all(layer is layers[0] for layer in layers)
    assert parameter_stats(model)["parameters"] == before["parameters"] - 3 * one_layer
    query = {id(p) for n, p in model.named_parameters(remove_duplicate=False) if "query.weight" in n}
    assert len(query) == 1


def test_mean_init_averages_and_layer_init_copies(four_layer_dir: Path):
    model, _ = load_classifier(four_layer_dir)
    originals = [layer.intermediate.dense.weight.detach().clone() for layer in encoder_layers(model)]
    _tied(model, "groups", [[0, 1], [2, 3]])
    layers = encoder_layers(model)
    assert torch.allclose(layers[1].intermediate.dense.weight, (originals[0] + originals[1]) / 2)
    assert torch.allclose(layers[2].intermediate.dense.weight, (originals[2] + originals[3]) / 2)
    model, _ = load_classifier(four_layer_dir)
    _tied(model, "groups", [[0, 1], [2, 3]], init=1)
    assert torch.equal(encoder_layers(model)[0].intermediate.dense.weight, originals[1])
    assert torch.equal(encoder_layers(model)[2].intermediate.dense.weight, originals[3])


@pytest.mark.parametrize(
    ("mode", "shared", "private"),
    [("attention", "attention", "intermediate"), ("ffn", "intermediate", "attention")],
)
def test_sub_block_modes_tie_only_that_block(four_layer_dir: Path, mode: str, shared: str, private: str):
    model, _ = load_classifier(four_layer_dir)
    _tied(model, mode)
    layers = encoder_layers(model)
    assert all(getattr(layer, shared) is getattr(layers[0], shared) for layer in layers)
    assert len({id(getattr(layer, private)) for layer in layers}) == 4
    assert len({id(layer) for layer in layers}) == 4


def test_ties_survive_training_steps(four_layer_dir: Path):
    model, tokenizer = load_classifier(four_layer_dir)
    _tied(model, "groups", [[0, 2], [1, 3]])
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = _batch(tokenizer)
    start = encoder_layers(model)[0].output.dense.weight.detach().clone()
    for _ in range(3):
        loss = model(**batch, labels=torch.tensor([1, 0])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    layers = encoder_layers(model)
    assert layers[0] is layers[2] and layers[1] is layers[3] and layers[0] is not layers[1]
    assert not torch.equal(layers[0].output.dense.weight, start)
    assert len(optimizer.param_groups[0]["params"]) < len(
        list(model.named_parameters(remove_duplicate=False))
    )


def test_ties_survive_save_and_load(four_layer_dir: Path, tmp_path: Path):
    model, tokenizer = load_classifier(four_layer_dir)
    _tied(model, "groups", [[0, 1, 2]])
    save_shared_checkpoint(model, tokenizer, tmp_path / "shared")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "shared" / "model.safetensors"), "pt") as handle:
        stored = list(handle.keys())
    assert not any(key.startswith(("bert.encoder.layer.1.", "bert.encoder.layer.2.")) for key in stored)
    loaded, loaded_tok = load_shared_classifier(tmp_path / "shared")
    layers = encoder_layers(loaded)
    assert layers[0] is layers[1] is layers[2] and layers[3] is not layers[0]
    assert parameter_stats(loaded) == parameter_stats(model)
    model.eval()
    with torch.no_grad():
        assert torch.allclose(
            model(**_batch(tokenizer)).logits, loaded(**_batch(loaded_tok)).logits, atol=1e-6
        )


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([[0, 1], [1, 2]], "layer 1 is in group 0 and group 1"),
        ([[0, 4]], "layer 4 is out of range"),
        ([[2]], "fewer than two layers"),
    ],
)
def test_bad_groups_are_config_errors(groups, message: str):
    with pytest.raises(RecipeError, match=message):
        make_plan("groups", 4, groups)


def test_init_position_outside_a_group_is_a_config_error(four_layer_dir: Path):
    model, _ = load_classifier(four_layer_dir)
    with pytest.raises(RecipeError, match="position 2"):
        tie_layers(model, make_plan("groups", 4, [[0, 1], [2, 3]]), init=2)


def _relaxed(model, rank: int, mode: str = "all", init: str = "mean"):
    plan = make_plan(mode, len(encoder_layers(model)), relax_rank=rank)
    tie_layers(model, plan, init=init)
    set_sharing_spec(model, layers=plan.to_json())


def _linears(layer) -> dict[str, torch.nn.Module]:
    from compress.share.tying import RelaxedLinear

    return {n: m for n, m in layer.named_modules() if isinstance(m, RelaxedLinear)}


def test_full_rank_relaxation_computes_exactly_what_the_untied_model_did(four_layer_dir: Path):
    model, tokenizer = load_classifier(four_layer_dir)
    model.eval()
    with torch.no_grad():
        before = model(**_batch(tokenizer)).logits
    _relaxed(model, rank=10_000)  # capped at each weight's full rank
    with torch.no_grad():
        after = model(**_batch(tokenizer)).logits
    assert torch.allclose(before, after, atol=1e-5)
    layers = encoder_layers(model)
    per_layer = [_linears(layer) for layer in layers]
    assert per_layer[0] and set(per_layer[0]) == set(per_layer[3])
    for name in per_layer[0]:  # one shared weight per linear, a correction of its own per layer
        assert len({id(linears[name].base.weight) for linears in per_layer}) == 1
        assert len({id(linears[name].lora_a) for linears in per_layer}) == 4


def test_rank_r_relaxation_misses_each_weight_by_its_discarded_singular_values(four_layer_dir: Path):
    model, _ = load_classifier(four_layer_dir)
    originals = [layer.intermediate.dense.weight.detach().clone() for layer in encoder_layers(model)]
    mean = torch.stack(originals).mean(dim=0)
    _relaxed(model, rank=3)
    for original, layer in zip(originals, encoder_layers(model), strict=True):
        relaxed = layer.intermediate.dense
        approx = relaxed.base.weight + relaxed.lora_b @ relaxed.lora_a
        discarded = torch.linalg.svdvals((original - mean).double())[3:]
        error = torch.linalg.norm((original - approx).double())
        assert torch.isclose(error, discarded.square().sum().sqrt(), rtol=1e-4)


def test_relaxation_costs_r_times_in_plus_out_per_linear_per_layer(four_layer_dir: Path):
    model, _ = load_classifier(four_layer_dir)
    untied = parameter_stats(model)["parameters"]
    one_layer = sum(p.numel() for p in encoder_layers(model)[0].parameters())
    shapes = [m.weight.shape for m in encoder_layers(model)[0].modules() if isinstance(m, torch.nn.Linear)]
    _relaxed(model, rank=4)
    corrections = 4 * sum(4 * (out + inp) for out, inp in shapes)
    assert parameter_stats(model)["parameters"] == untied - 3 * one_layer + corrections


def test_relaxed_ties_survive_save_and_load(four_layer_dir: Path, tmp_path: Path):
    model, tokenizer = load_classifier(four_layer_dir)
    _relaxed(model, rank=4, mode="ffn")
    save_shared_checkpoint(model, tokenizer, tmp_path / "relaxed")
    loaded, loaded_tok = load_shared_classifier(tmp_path / "relaxed")
    assert parameter_stats(loaded) == parameter_stats(model)
    layers = encoder_layers(loaded)
    bases = {id(layer.intermediate.dense.base.weight) for layer in layers}
    corrections = {id(layer.intermediate.dense.lora_b) for layer in layers}
    assert len(bases) == 1 and len(corrections) == 4
    model.eval()
    with torch.no_grad():
        assert torch.allclose(
            model(**_batch(tokenizer)).logits, loaded(**_batch(loaded_tok)).logits, atol=1e-6
        )


def _relaxation_error(model, originals: list[dict[str, torch.Tensor]]) -> float:
    """sum over layers and linears of ||trained W_i - (shared W + B_i A_i)||²."""
    error = 0.0
    for layer, original in zip(encoder_layers(model), originals, strict=True):
        for name, relaxed in _linears(layer).items():
            approx = relaxed.base.weight + relaxed.lora_b @ relaxed.lora_a
            error += float(((original[f"{name}.weight"] - approx) ** 2).sum())
    return error


def test_fit_init_lands_closer_to_every_trained_layer_than_the_mean(four_layer_dir: Path):
    errors = {}
    for init in ("mean", "fit"):
        model, _ = load_classifier(four_layer_dir)
        originals = [
            {n: p.detach().clone() for n, p in layer.named_parameters()} for layer in encoder_layers(model)
        ]
        _relaxed(model, rank=3, init=init)
        errors[init] = _relaxation_error(model, originals)
    assert errors["fit"] < 0.95 * errors["mean"]


def test_fit_steps_never_raise_the_error_and_need_relaxation(four_layer_dir: Path):
    from compress.share.tying import fit_shared_weights

    model, _ = load_classifier(four_layer_dir)
    layers = encoder_layers(model)
    originals = [{n: p.detach().clone() for n, p in layer.named_parameters()} for layer in layers]
    history = fit_shared_weights(layers[0], originals, rank=3)
    assert len(history) >= 2 and all(b <= a + 1e-9 for a, b in pairwise(history))
    with pytest.raises(RecipeError, match=r"init: fit .* set relax_rank"):
        tie_layers(model, make_plan("all", 4), init="fit")
