"""The quantize stage: schemes checked against the target, loss within tolerance or a clear failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from compress.errors import ExportError, RecipeError
from compress.export import Classifier
from compress.io import read_json
from compress.models import load_classifier
from compress.quantize.onnx import float_lookup_tables
from compress.quantize.search import candidate_counts, search_units
from compress.stages.quantize import QuantizeConfig, check_scheme, schemes_by_target
from compress.targets import TargetProfile
from tests.helpers.tiny import write_recipe


def board(schemes: list[str], float_fallback: bool = True) -> TargetProfile:
    return TargetProfile(
        name="npu-board",
        format="tflite",
        runtime="litert",
        sequence_lengths=[16],
        input_dtype="int32",
        quantization={"schemes": schemes, "float_fallback": float_fallback},
    )


def test_a_scheme_the_target_does_not_allow_is_a_one_line_error():
    with pytest.raises(RecipeError, match="target 'npu-board' allows \\['dynamic'\\], not 'static'") as info:
        check_scheme(board(["dynamic"]), QuantizeConfig(scheme="static"), "static")
    assert "\n" not in str(info.value)
    with pytest.raises(RecipeError, match="not 'auto'"):
        check_scheme(board(["dynamic"]), QuantizeConfig(scheme="auto"), "auto")
    check_scheme(board(["dynamic"]), QuantizeConfig(scheme="dynamic"), "dynamic")


def test_a_scheme_mapping_gives_each_target_its_own_scheme():
    config = QuantizeConfig(scheme={"npu-board": "weight-only", "arm64-onnx": "dynamic"})
    schemes = schemes_by_target(config, ["npu-board", "arm64-onnx"])
    assert schemes == {"npu-board": "weight-only", "arm64-onnx": "dynamic"}
    check_scheme(board(["weight-only"]), config, schemes["npu-board"])
    with pytest.raises(RecipeError, match="allows \\['dynamic'\\], not 'weight-only'"):
        check_scheme(board(["dynamic"]), config, schemes["npu-board"])
    with pytest.raises(RecipeError, match="no scheme for target 'other'"):
        schemes_by_target(config, ["npu-board", "arm64-onnx", "other"])
    assert schemes_by_target(QuantizeConfig(scheme="static"), ["a", "b"]) == {"a": "static", "b": "static"}


def test_weight_only_is_refused_for_onnx_targets():
    with pytest.raises(ValueError, match="weight-only is a TFLite scheme"):
        TargetProfile(
            name="board",
            format="onnx",
            runtime="onnxruntime",
            sequence_lengths=[16],
            input_dtype="int64",
            quantization={"schemes": ["weight-only"]},
        )


def test_a_target_without_float_fallback_refuses_float_layers():
    with pytest.raises(RecipeError, match="float_fallback: false"):
        check_scheme(board(["static"], float_fallback=False), QuantizeConfig(scheme="auto"), "auto")
    with pytest.raises(RecipeError, match="float_fallback: false"):
        check_scheme(
            board(["static"], float_fallback=False),
            QuantizeConfig(scheme="static", float_layers=["bert.encoder.layer.0"]),
            "static",
        )


def test_search_units_are_blocks_and_outside_linears_with_shared_blocks_once(tiny_bert_dir):
    model, _ = load_classifier(tiny_bert_dir)
    units = search_units(Classifier(model))
    assert units == [
        "model.bert.encoder.layer.0",
        "model.bert.encoder.layer.1",
        "model.bert.pooler.dense",
        "model.classifier",
    ]
    model.bert.encoder.layer[1] = model.bert.encoder.layer[0]
    assert search_units(Classifier(model))[:2] == ["model.bert.encoder.layer.0", "model.bert.pooler.dense"]


def test_candidates_grow_from_no_float_layer():
    assert candidate_counts(8, 6) == [0, 1, 2, 4, 8]
    assert candidate_counts(8, 3) == [0, 1, 2]
    assert candidate_counts(0, 6) == [0]


def run_tiny(tmp_path, tiny_bert_dir, reviews, stage: str, targets: str = "arm64-onnx"):
    from compress.pipeline import run_recipe
    from compress.recipe import load_recipe

    path = write_recipe(
        tmp_path / "r.yaml",
        teacher=tiny_bert_dir,
        data=reviews,
        stages=stage,
        extra=f"targets: [{targets}]\n",
    )
    return run_recipe(load_recipe(path), tmp_path / "runs")


@pytest.mark.slow
def test_dynamic_stage_writes_an_agreeing_int8_artifact(tmp_path, tiny_bert_dir, reviews):
    result = run_tiny(tmp_path, tiny_bert_dir, reviews, "  - type: quantize\n")
    stage = next(s for s in result.stages if s.type == "quantize")
    metrics = read_json(stage.dir / "manifest.json")["metrics"]["artifacts"]["arm64-onnx-int8"]
    assert metrics["agreement"] >= 0.99 and metrics["samples"] == 32
    assert metrics["bytes"] < metrics["float_bytes"]
    manifest = read_json(stage.dir / "arm64-onnx-int8" / "manifest.json")
    assert manifest["name"] == f"{stage.dir.name}/arm64-onnx-int8"
    assert manifest["precision"] == "int8" and manifest["target"] == "arm64-onnx"
    assert manifest["check"]["eval"]["agreement"] == metrics["agreement"]


@pytest.mark.slow
def test_an_int8_artifact_over_tolerable_loss_fails_the_stage(tmp_path, tiny_bert_dir, reviews, monkeypatch):
    import compress.quantize as quantize

    real = quantize.agreement

    def lossy(float_logits, int8_logits, labels):
        measured = real(float_logits, int8_logits, labels)
        return {**measured, "agreement": 0.9}

    monkeypatch.setattr(quantize, "agreement", lossy)
    with pytest.raises(ExportError, match=r"arm64-onnx-int8 loses 10\.00% .* over tolerable_loss 1\.00%"):
        run_tiny(tmp_path, tiny_bert_dir, reviews, "  - type: quantize\n")
    result = run_tiny(tmp_path, tiny_bert_dir, reviews, "  - type: quantize\n    allow_loss_miss: true\n")
    stage = next(s for s in result.stages if s.type == "quantize")
    assert read_json(stage.dir / "manifest.json")["info"]["loss_missed"] == ["arm64-onnx-int8"]


@pytest.mark.slow
def test_auto_searches_float_layers_and_ships_an_int8_onnx(tmp_path, tiny_bert_dir, reviews):
    import onnx

    stage_yaml = "  - type: quantize\n    scheme: auto\n    max_trials: 2\n    float_layers: [classifier]\n"
    result = run_tiny(tmp_path, tiny_bert_dir, reviews, stage_yaml)
    stage = next(s for s in result.stages if s.type == "quantize")
    info = read_json(stage.dir / "manifest.json")["info"]["search"]
    assert info["baseline"] == 1.0 and info["met"] and 1 <= len(info["trials"]) <= 2
    assert set(info["sensitivity"]) == {"bert.encoder.layer.0", "bert.encoder.layer.1", "bert.pooler.dense"}
    folder = stage.dir / "arm64-onnx-int8"
    quantization = read_json(folder / "manifest.json")["quantization"]
    assert quantization["float_layers"][0] == "classifier" and quantization["search"]["met"]
    graph = onnx.load(str(folder / "model.onnx")).graph
    assert any(i.data_type == onnx.TensorProto.INT8 for i in graph.initializer)
    assert not float_lookup_tables(folder / "model.onnx")  # embedding tables stored int8 as well
    metrics = read_json(stage.dir / "manifest.json")["metrics"]["artifacts"]["arm64-onnx-int8"]
    assert metrics["agreement"] >= 0.99 and metrics["bytes"] < metrics["float_bytes"]


@pytest.mark.slow
def test_a_scheme_per_target_ships_weight_only_tflite_beside_dynamic_onnx(tmp_path, tiny_bert_dir, reviews):
    stage_yaml = "  - type: quantize\n    scheme: {arm64-onnx: dynamic, raspberry-pi-4: weight-only}\n"
    result = run_tiny(tmp_path, tiny_bert_dir, reviews, stage_yaml, targets="arm64-onnx, raspberry-pi-4")
    stage = next(s for s in result.stages if s.type == "quantize")
    metrics = read_json(stage.dir / "manifest.json")["metrics"]["artifacts"]
    assert metrics["arm64-onnx-int8"]["scheme"] == "dynamic"
    assert metrics["raspberry-pi-4-int8"]["scheme"] == "weight-only"
    assert metrics["raspberry-pi-4-int8"]["agreement"] == 1.0
    quantization = read_json(stage.dir / "raspberry-pi-4-int8" / "manifest.json")["quantization"]
    assert quantization["granularity"] == "per-channel" and quantization["activations"] == "float"


@pytest.mark.slow
def test_the_pi_gets_dynamic_int8_and_a_measured_weight_only_fallback(tmp_path, tiny_bert_dir, reviews):
    result = run_tiny(tmp_path, tiny_bert_dir, reviews, "  - type: quantize\n", targets="raspberry-pi-4")
    stage = next(s for s in result.stages if s.type == "quantize")
    metrics = read_json(stage.dir / "manifest.json")["metrics"]["artifacts"]["raspberry-pi-4-int8"]
    assert metrics["scheme"] == "dynamic"
    fallback = metrics["fallbacks"]["fallback-weight-only.tflite"]
    assert fallback["samples"] == metrics["samples"] and fallback["agreement"] >= 0.99
    assert metrics["bytes"] == (stage.dir / "raspberry-pi-4-int8" / "model.tflite").stat().st_size
    manifest = read_json(stage.dir / "raspberry-pi-4-int8" / "manifest.json")
    assert manifest["quantization"]["granularity"] == "per-channel"
    assert manifest["fallbacks"][0]["check"]["eval"]["agreement"] == fallback["agreement"]


def test_a_scheme_for_a_target_the_stage_does_not_quantize_is_an_error(tmp_path, tiny_bert_dir, reviews):
    stage_yaml = "  - type: quantize\n    scheme: {arm64-onnx: dynamic, android-arm64: dynamic}\n"
    with pytest.raises(RecipeError, match="'android-arm64' is not a target of this stage"):
        run_tiny(tmp_path, tiny_bert_dir, reviews, stage_yaml)


@pytest.fixture(scope="module")
def wide_bert_dir(tmp_path_factory):
    """Hidden 128: its weights (64-128 KiB each) are large enough for the int8 constant check."""
    from tests.helpers.tiny import make_tiny_bert

    return make_tiny_bert(tmp_path_factory.mktemp("wide-bert"), hidden=128)


@pytest.mark.slow
def test_auto_keeps_its_searched_float_layers_float_and_every_other_large_weight_int8(
    tmp_path, wide_bert_dir, reviews
):
    stage_yaml = (
        "  - type: quantize\n    scheme: auto\n    max_trials: 1\n    float_layers: [bert.encoder.layer.1]\n"
    )
    result = run_tiny(tmp_path, wide_bert_dir, reviews, stage_yaml)
    stage = next(s for s in result.stages if s.type == "quantize")
    quantization = read_json(stage.dir / "arm64-onnx-int8" / "manifest.json")["quantization"]
    assert "bert.encoder.layer.1" in quantization["float_layers"]
    assert quantization["float_constant_bytes"] >= 4 * 64 * 1024  # layer 1's weights, float on purpose


@pytest.mark.slow
@pytest.mark.parametrize(
    "stage_yaml", ["    op_types: [MatMul]\n", "    scheme: static\n    op_types: [MatMul, Gemm]\n"]
)
def test_op_types_that_leave_the_tables_float_are_float_on_purpose(
    tmp_path, wide_bert_dir, reviews, stage_yaml
):
    result = run_tiny(tmp_path, wide_bert_dir, reviews, "  - type: quantize\n" + stage_yaml)
    stage = next(s for s in result.stages if s.type == "quantize")
    quantization = read_json(stage.dir / "arm64-onnx-int8" / "manifest.json")["quantization"]
    assert quantization["float_constant_bytes"] > 0  # the word table, which no chosen op type reads


@pytest.mark.parametrize("recipe", ["distil8.yaml", "share8.yaml"])
def test_the_shipped_recipes_give_the_pi_dynamic_int8_with_its_fallback(recipe):
    from compress.recipe import load_recipe
    from compress.targets import load_target

    loaded = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / recipe)
    (stage,) = [s for s in loaded.stages if s.type == "quantize"]
    schemes = schemes_by_target(stage, list(loaded.targets))
    assert schemes["raspberry-pi-4"] == "dynamic"
    pi = load_target("raspberry-pi-4")
    check_scheme(pi, stage, "dynamic")
    assert [(r.interpreter, r.scheme) for r in pi.fallbacks_for("dynamic")] == [
        ("tflite_runtime", "weight-only")
    ]
    assert pi.quantization.granularity == "per-channel"


def test_a_fallback_with_a_scheme_it_computes_wrongly_is_refused():
    rule = {
        "interpreter": "tflite_runtime",
        "below": "2.15",
        "schemes": ["dynamic"],
        "scheme": "dynamic",
        "reason": "x",
    }
    with pytest.raises(ValueError, match="gets scheme dynamic, one of the schemes it computes wrongly"):
        board(["dynamic"]).quantization.model_validate({"fallbacks": [rule]})


def test_embedding_bits_4_is_checked_against_the_scheme_and_the_block_size():
    from pydantic import ValidationError

    onnx_board = board(["dynamic", "static"]).model_copy(update={"format": "onnx", "name": "onnx-board"})
    check_scheme(onnx_board, QuantizeConfig(embedding_bits=4), "dynamic")
    check_scheme(onnx_board, QuantizeConfig(embedding_bits=4), "static")
    with pytest.raises(RecipeError, match="4 is for the dynamic and static ONNX schemes, not 'auto'"):
        check_scheme(onnx_board, QuantizeConfig(embedding_bits=4, scheme="auto"), "auto")
    # TFLite targets keep int8 tables: the same config passes them
    check_scheme(board(["dynamic"]), QuantizeConfig(embedding_bits=4), "dynamic")
    with pytest.raises(ValidationError, match="embedding_block 48 is not a power of two"):
        QuantizeConfig(embedding_bits=4, embedding_block=48)
    with pytest.raises(ValidationError):
        QuantizeConfig(embedding_bits=2)
    assert QuantizeConfig(embedding_bits=4, embedding_lookup="blocked").embedding_lookup == "blocked"
    assert QuantizeConfig(embedding_bits=4).embedding_lookup == "fold"
    with pytest.raises(ValueError, match="embedding_lookup: blocked says how int4 tables are read"):
        QuantizeConfig(embedding_lookup="blocked")
    with pytest.raises(ValueError, match="embedding_lookup"):
        QuantizeConfig(embedding_bits=4, embedding_lookup="gather")


@pytest.mark.slow
def test_embedding_bits_4_in_a_stage_of_tflite_targets_only_is_an_error(tmp_path, tiny_bert_dir, reviews):
    with pytest.raises(RecipeError, match="embedding_bits: 4 applies to ONNX targets, and this stage has"):
        run_tiny(
            tmp_path, tiny_bert_dir, reviews, "  - type: quantize\n    embedding_bits: 4\n", "raspberry-pi-4"
        )


@pytest.mark.slow
def test_embedding_bits_4_stage_ships_int4_tables_and_records_them(tmp_path, tiny_bert_dir, reviews):
    stage = "  - type: quantize\n    embedding_bits: 4\n    embedding_block: 16\n"
    result = run_tiny(tmp_path, tiny_bert_dir, reviews, stage)
    stage = next(s for s in result.stages if s.type == "quantize")
    manifest = read_json(stage.dir / "arm64-onnx-int8" / "manifest.json")
    assert manifest["quantization"]["embedding"]["bits"] == 4
    assert manifest["quantization"]["embedding"]["block_size"] == 16
    assert not float_lookup_tables(stage.dir / "arm64-onnx-int8" / "model.onnx")
    metrics = read_json(stage.dir / "manifest.json")["metrics"]["artifacts"]["arm64-onnx-int8"]
    assert metrics["agreement"] >= 0.9 and metrics["bytes"] < metrics["float_bytes"]
