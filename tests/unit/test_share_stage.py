"""The ``share`` stage in a run: every transform is applied, measured, saved once and reloads tied."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from compress.errors import RecipeError
from compress.io import read_json
from compress.pipeline import run_recipe
from compress.recipe import load_recipe
from compress.share.model import load_shared_classifier, parameter_stats
from compress.share.tying import encoder_layers
from tests.helpers.tiny import write_recipe

SHARE = """  - type: share
    layers: {{mode: all}}
    embedding_rank: 8
    vocab: {{characters: none}}
    positions: 16
    recovery: {recovery}
"""


def test_share_stage_applies_every_transform_and_saves_each_tensor_once(
    tmp_path, tiny_bert_dir, reviews, caplog
):
    caplog.set_level(logging.INFO, logger="compress")
    recipe = load_recipe(
        write_recipe(
            tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=SHARE.format(recovery="null")
        )
    )
    stage = run_recipe(recipe, tmp_path / "runs").stages[0]
    manifest = read_json(stage.dir / "manifest.json")
    metrics = manifest["metrics"]
    assert [s["step"] for s in metrics["steps"]] == ["input", "vocab", "positions", "embedding", "layers"]
    sizes = [s["parameters"] for s in metrics["steps"]]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 5
    assert all(0 <= s["accuracy"] <= 1 for s in metrics["steps"])
    assert metrics["accuracy_after_tying"] == metrics["steps"][-1]["accuracy"]
    embedding = metrics["steps"][3]
    assert embedding["weights"] == "frequency"  # the default: rows weighted by the training text's counts
    assert 0 < embedding["relative_error"] < 1 and 0 < embedding["unweighted_relative_error"] < 1
    shown = [r.getMessage() for r in caplog.records if r.getMessage().startswith("share ")]
    assert len(shown) == 5
    assert all(re.fullmatch(r"share \w+: [\d,]+ parameters, eval accuracy \d\.\d{4}", line) for line in shown)
    model, tokenizer = load_shared_classifier(stage.dir)
    layers = encoder_layers(model)
    assert layers[0] is layers[1]
    assert parameter_stats(model)["bytes"] == metrics["bytes"]
    # the file is the unique tensors plus a small JSON header, not one copy per layer
    assert metrics["bytes"] <= metrics["checkpoint_bytes"] < metrics["bytes"] + 16_000
    config = read_json(stage.dir / "config.json")
    assert config["compress_sharing"]["embedding_rank"] == 8
    assert config["vocab_size"] == model.get_input_embeddings().num_embeddings == len(tokenizer)
    assert config["max_position_embeddings"] == 16


def test_share_stage_needs_a_transform(tmp_path, tiny_bert_dir, reviews):
    path = write_recipe(
        tmp_path / "r.yaml",
        teacher=tiny_bert_dir,
        data=reviews,
        stages="  - type: share\n    recovery: null\n",
    )
    with pytest.raises(RecipeError, match="at least one of layers, embedding_rank, vocab, positions or ffn"):
        load_recipe(path)


def test_ffn_pruning_in_the_stage_gives_a_plain_narrower_checkpoint(tmp_path, tiny_bert_dir, reviews):
    stages = "  - type: share\n    embedding_rank: 8\n    ffn: 40\n    recovery: null\n"
    path = write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=stages)
    recipe = load_recipe(path)
    stage = run_recipe(recipe, tmp_path / "runs").stages[0]
    metrics = read_json(stage.dir / "manifest.json")["metrics"]
    assert [s["step"] for s in metrics["steps"]] == ["input", "embedding", "ffn"]
    ffn = metrics["steps"][-1]
    assert (ffn["ffn_before"], ffn["ffn_after"]) == (64, 40) and len(ffn["energy_kept"]) == 2
    assert all(0 < kept < 1 for kept in ffn["energy_kept"])
    assert ffn["parameters"] == metrics["steps"][1]["parameters"] - 2 * 24 * (2 * 32 + 1)
    model, _ = load_shared_classifier(stage.dir)
    assert model.config.intermediate_size == 40
    assert all(layer.intermediate.dense.out_features == 40 for layer in encoder_layers(model))
    assert parameter_stats(model)["bytes"] == metrics["bytes"]


def test_an_ffn_width_the_model_does_not_have_is_one_line(tmp_path, tiny_bert_dir, reviews):
    stages = "  - type: share\n    ffn: 64\n    recovery: null\n"
    path = write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=stages)
    recipe = load_recipe(path)
    refused = r"stages\[0\]\.ffn: 64 must be between 1 and 63 \(the feed-forward width is 64\); e\.g\. ffn"
    with pytest.raises(RecipeError, match=refused):
        run_recipe(recipe, tmp_path / "runs")
    assert not list((tmp_path / "runs").glob("*/01-share/model.safetensors"))


@pytest.mark.slow
def test_recovery_distils_the_shared_student_and_keeps_it_tied(tmp_path, tiny_bert_dir, reviews):
    recovery = "{epochs: 2, batch_size: 16, lr: 3.0e-3, patience: null}"
    recipe = load_recipe(
        write_recipe(
            tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=SHARE.format(recovery=recovery)
        )
    )
    stage = run_recipe(recipe, tmp_path / "runs").stages[0]
    metrics = read_json(stage.dir / "manifest.json")["metrics"]
    assert [s["step"] for s in metrics["steps"]][-2:] == ["layers", "recovery"]
    assert metrics["recovery"]["epochs_run"] == 2
    assert metrics["accuracy"] == metrics["steps"][-1]["accuracy"]
    assert metrics["accuracy_after_tying"] == metrics["steps"][-2]["accuracy"]
    model, _ = load_shared_classifier(stage.dir)
    assert encoder_layers(model)[0] is encoder_layers(model)[1]
    assert parameter_stats(model)["bytes"] == metrics["bytes"] == metrics["steps"][-2]["bytes"]


@pytest.mark.slow
def test_relaxed_sharing_recovers_and_reloads_with_its_corrections(tmp_path, tiny_bert_dir, reviews):
    stages = SHARE.format(recovery="{epochs: 1, batch_size: 16, lr: 3.0e-3}").replace(
        "{mode: all}", "{mode: all, relax_rank: 4}"
    )
    recipe = load_recipe(
        write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=stages)
    )
    stage = run_recipe(recipe, tmp_path / "runs").stages[0]
    metrics = read_json(stage.dir / "manifest.json")["metrics"]
    assert read_json(stage.dir / "config.json")["compress_sharing"]["layers"]["relax_rank"] == 4
    model, _ = load_shared_classifier(stage.dir)
    first, second = (layer.attention.self.query for layer in encoder_layers(model))
    assert first.base.weight is second.base.weight and first.lora_a is not second.lora_a
    assert not torch.equal(first.lora_b, second.lora_b)
    assert parameter_stats(model)["bytes"] == metrics["bytes"]
