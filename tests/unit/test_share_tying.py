"""Cross-layer sharing: ties are one tensor, stay tied through training and save/load, bad groups fail."""

from __future__ import annotations

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
