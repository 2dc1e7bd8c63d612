"""TFLite int8 with ai-edge-quantizer: dynamic and static, float scopes from module names, float logits."""

from __future__ import annotations

import re

import numpy as np
import pytest

from compress.errors import ExportError
from compress.export import SAMPLE_TEXTS, input_names
from compress.export.tflite import export_tflite
from compress.models import load_classifier
from compress.quantize import predict_logits
from compress.quantize.tflite import (
    build_quantizer,
    layer_scope,
    quantize_tflite,
    signature_feeds,
    write_model,
)
from compress.targets import TargetProfile, load_target

TENSOR = (
    "compress.export.Classifier/transformers.models.bert.modeling_bert.BertForSequenceClassification_model/"
    "transformers.models.bert.modeling_bert.BertModel_bert/transformers.models.bert.modeling_bert.BertEncoder_encoder/"
    "transformers.models.bert.modeling_bert.BertLayer_{i}/transformers.models.bert.modeling_bert.BertIntermediate_"
    "intermediate/torch.nn.modules.linear.Linear_dense;3"
)


def test_layer_scope_matches_the_traced_module_path_only():
    assert re.search(layer_scope("bert.encoder.layer.1"), TENSOR.format(i=1))
    assert re.search(layer_scope("bert.encoder.layer.1.intermediate.dense"), TENSOR.format(i=1))
    assert not re.search(layer_scope("bert.encoder.layer.1"), TENSOR.format(i=11))
    assert not re.search(layer_scope("bert.encoder.layer.1.output"), TENSOR.format(i=1))


@pytest.fixture(scope="module")
def tiny_tflite(tiny_bert_dir, tmp_path_factory):
    model, tokenizer = load_classifier(tiny_bert_dir)
    profile = TargetProfile(
        name="test-phone", format="tflite", runtime="litert", sequence_lengths=[16, 32], input_dtype="int32"
    )
    folder = tmp_path_factory.mktemp("tflite") / "fp32"
    export_tflite(model, tokenizer, folder, profile)
    calibration = signature_feeds(tokenizer, input_names(model), SAMPLE_TEXTS * 2, None, [16, 32])
    return folder, calibration


def test_every_signature_gets_calibration_samples(tiny_tflite):
    _, calibration = tiny_tflite
    assert set(calibration) == {"seq_16", "seq_32"}
    assert all(calibration[k] for k in calibration)
    assert all(
        f["input_ids"].dtype == np.int32 and f["input_ids"].shape == (1, 16) for f in calibration["seq_16"]
    )


@pytest.mark.parametrize("scheme", ["dynamic", "static"])
def test_int8_keeps_float_logits_and_stays_close(tmp_path, tiny_tflite, scheme):
    float_dir, calibration = tiny_tflite
    manifest = quantize_tflite(float_dir, tmp_path / scheme, scheme=scheme, calibration=calibration)
    assert manifest["precision"] == "int8" and manifest["quantization"]["scheme"] == scheme
    assert manifest["outputs"] == [{"name": "logits", "dtype": "float32", "shape": [1, 2]}]
    got = predict_logits(tmp_path / scheme, SAMPLE_TEXTS, None)
    ref = predict_logits(float_dir, SAMPLE_TEXTS, None)
    assert got.dtype == np.float32 and np.abs(got - ref).max() < 0.05


def test_weight_only_stores_int8_weights_and_computes_in_float(tmp_path, tiny_tflite):
    float_dir, _ = tiny_tflite
    manifest = quantize_tflite(float_dir, tmp_path / "wo", scheme="weight-only")
    quantization = manifest["quantization"]
    assert quantization["scheme"] == "weight-only" and quantization["activations"] == "float"
    model = tmp_path / "wo" / "model.tflite"
    assert int8_tensor_count(model) > 0
    dynamic = quantize_tflite(float_dir, tmp_path / "dyn", scheme="dynamic")
    assert dynamic["quantization"]["activations"] == "dynamic"
    # the same weights stored as int8 as with dynamic-range; only the compute differs
    assert int8_bytes(model) == int8_bytes(tmp_path / "dyn" / "model.tflite")
    assert model.stat().st_size < (float_dir / "model.tflite").stat().st_size
    from ai_edge_litert.interpreter import Interpreter

    ops = {op["op_name"] for op in Interpreter(model_path=str(model))._get_ops_details()}
    assert "DEQUANTIZE" in ops
    got = predict_logits(tmp_path / "wo", SAMPLE_TEXTS, None)
    ref = predict_logits(float_dir, SAMPLE_TEXTS, None)
    assert np.abs(got - ref).max() < 0.01


def int8_bytes(path) -> int:
    from ai_edge_litert.interpreter import Interpreter

    details = Interpreter(model_path=str(path)).get_tensor_details()
    return sum(int(np.prod(d["shape"])) for d in details if np.dtype(d["dtype"]) == np.int8)


def int8_tensor_count(path) -> int:
    from ai_edge_litert.interpreter import Interpreter

    return sum(
        np.dtype(d["dtype"]) == np.int8 for d in Interpreter(model_path=str(path)).get_tensor_details()
    )


def float_lookup_tables(path) -> list[int]:
    """Tables that an EMBEDDING_LOOKUP reads from a stored fp32 tensor (not a DEQUANTIZE of int8)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    ops = interpreter._get_ops_details()
    produced = {int(t) for op in ops for t in op["outputs"]}
    return [
        int(op["inputs"][1])
        for op in ops
        if op["op_name"] == "EMBEDDING_LOOKUP" and int(op["inputs"][1]) not in produced
    ]


def test_float_layers_leave_fewer_int8_tensors(tmp_path, tiny_tflite):
    float_dir, calibration = tiny_tflite
    quantize_tflite(float_dir, tmp_path / "all", scheme="static", calibration=calibration)
    manifest = quantize_tflite(
        float_dir,
        tmp_path / "some",
        scheme="static",
        calibration=calibration,
        float_layers=["bert.encoder.layer.1"],
    )
    assert manifest["quantization"]["float_layers"] == ["bert.encoder.layer.1"]
    assert int8_tensor_count(tmp_path / "some" / "model.tflite") < int8_tensor_count(
        tmp_path / "all" / "model.tflite"
    )


def test_static_needs_calibration(tmp_path, tiny_tflite):
    float_dir, _ = tiny_tflite
    with pytest.raises(ExportError, match="calibration samples"):
        quantize_tflite(float_dir, tmp_path / "x", scheme="static")


def test_static_quantizes_matmuls_unless_full_integer_is_asked(tmp_path, tiny_tflite):
    float_dir, calibration = tiny_tflite
    default = quantize_tflite(float_dir, tmp_path / "mm", scheme="static", calibration=calibration)
    full = quantize_tflite(
        float_dir, tmp_path / "full", scheme="static", calibration=calibration, full_integer=True
    )
    assert default["quantization"]["op_types"] == ["FULLY_CONNECTED", "BATCH_MATMUL", "EMBEDDING_LOOKUP"]
    assert full["quantization"]["op_types"] == "all"
    # the embedding tables are stored int8 too (weight-only: dequantized once, looked up in float)
    assert float_lookup_tables(float_dir / "model.tflite")
    assert not float_lookup_tables(tmp_path / "mm" / "model.tflite")
    assert int8_tensor_count(tmp_path / "full" / "model.tflite") > int8_tensor_count(
        tmp_path / "mm" / "model.tflite"
    )


def op_names(path) -> set[str]:
    from ai_edge_litert.interpreter import Interpreter

    return {op["op_name"] for op in Interpreter(model_path=str(path))._get_ops_details()}


def test_the_op_contract_lists_every_op_of_a_real_exported_model(tiny_tflite):
    from compress.export.tflite import tflite_ops
    from compress.io import read_json

    float_dir, _ = tiny_tflite
    ops = tflite_ops(float_dir / "model.tflite")
    # the interpreter's own list of the ops it loaded: the same names, each with a version
    assert {entry["op"] for entry in ops} == op_names(float_dir / "model.tflite")
    assert {"FULLY_CONNECTED", "BATCH_MATMUL"} <= {entry["op"] for entry in ops}
    assert all(isinstance(entry["version"], int) and entry["version"] >= 1 for entry in ops)
    runtime = read_json(float_dir / "manifest.json")["runtime"]
    assert runtime["ops"] == ops
    assert runtime["loaded_at_export"][0]["interpreter"] == "ai_edge_litert"
    assert runtime["loaded_at_export"][0]["loaded"] is True


def pi_profile() -> TargetProfile:
    """The stock Raspberry Pi 4 profile at the tiny artifact's lengths."""
    return load_target("raspberry-pi-4").model_copy(update={"sequence_lengths": [16, 32]})


def test_the_pi_default_is_dynamic_int8_with_a_weight_only_fallback_for_tflite_runtime(tmp_path, tiny_tflite):
    from compress.io import file_entries
    from compress.stages.quantize import QuantizeConfig

    float_dir, _ = tiny_tflite
    profile = pi_profile()
    scheme = QuantizeConfig().scheme
    assert scheme == "dynamic" and profile.quantization.granularity == "per-channel"
    manifest = quantize_tflite(float_dir, tmp_path / "pi", scheme=scheme, per_channel=True, profile=profile)
    assert manifest["quantization"]["scheme"] == "dynamic"
    assert manifest["quantization"]["activations"] == "dynamic"
    (fallback,) = manifest["fallbacks"]
    assert fallback["path"] == "fallback-weight-only.tflite" and fallback["scheme"] == "weight-only"
    assert fallback["interpreter"] == "tflite_runtime" and fallback["below"] == "2.15"
    assert "all-zero logits" in fallback["reason"]
    assert fallback["quantization"]["activations"] == "float"
    assert manifest["files"] == file_entries(tmp_path / "pi")
    assert "fallback-weight-only.tflite" in {entry["path"] for entry in manifest["files"]}
    # the primary computes its matmuls in int8; the fallback dequantizes its weights and computes in float
    primary_ops = {entry["op"] for entry in manifest["runtime"]["ops"]}
    fallback_ops = {entry["op"] for entry in fallback["runtime"]["ops"]}
    assert primary_ops == op_names(tmp_path / "pi" / "model.tflite")
    assert "DEQUANTIZE" in fallback_ops and "DEQUANTIZE" not in primary_ops
    assert [e["interpreter"] for e in manifest["runtime"]["loaded_at_export"]] == ["ai_edge_litert"]
    assert [e["interpreter"] for e in fallback["runtime"]["loaded_at_export"]] == ["tflite_runtime"]
    got = predict_logits(tmp_path / "pi", SAMPLE_TEXTS, None)  # ai_edge_litert: the primary
    ref = predict_logits(float_dir, SAMPLE_TEXTS, None)
    assert np.abs(got - ref).max() < 0.05


def test_weight_only_primary_needs_no_fallback(tmp_path, tiny_tflite):
    float_dir, _ = tiny_tflite
    manifest = quantize_tflite(float_dir, tmp_path / "wo", scheme="weight-only", profile=pi_profile())
    assert "fallbacks" not in manifest
    assert not list((tmp_path / "wo").glob("fallback-*"))


def test_an_op_the_targets_runtime_cannot_load_fails_quantize_in_one_line(tmp_path, tiny_tflite, monkeypatch):
    import sys
    import types

    class Old:
        """How tflite-runtime refuses an op version newer than its kernels."""

        def __init__(self, model_path: str):
            raise ValueError(
                "Didn't find op for builtin opcode 'FULLY_CONNECTED' version '12'. An older version of this "
                "builtin might be supported. Are you using an old TFLite binary with a newer model?\n"
                "Registration failed.\n"
            )

    fake = types.ModuleType("tflite_runtime.interpreter")
    fake.Interpreter = Old
    monkeypatch.setitem(sys.modules, "tflite_runtime", types.ModuleType("tflite_runtime"))
    monkeypatch.setitem(sys.modules, "tflite_runtime.interpreter", fake)
    float_dir, _ = tiny_tflite
    with pytest.raises(
        ExportError,
        match=r"fallback-weight-only\.tflite: op FULLY_CONNECTED version 12 cannot run on tflite_runtime .*"
        r"target 'raspberry-pi-4' names",
    ) as info:
        quantize_tflite(float_dir, tmp_path / "pi", scheme="dynamic", profile=pi_profile())
    assert "\n" not in str(info.value)
    assert not (tmp_path / "pi").exists()


def test_a_fallback_that_keeps_large_float_constants_fails_quantize(tmp_path, tiny_tflite, monkeypatch):
    """The fallback ships as int8 too: the same every-large-constant check as the primary model."""
    import compress.quantize.tflite as qt

    real = qt.tflite_float_constants

    def fallback_left_float(path, scopes=()):
        found = real(path, scopes)
        return {**found, "encoder/layer_0/dense": 70_000} if path.name.startswith("fallback-") else found

    monkeypatch.setattr(qt, "tflite_float_constants", fallback_left_float)
    float_dir, _ = tiny_tflite
    with pytest.raises(
        ExportError, match=r"^fallback-weight-only\.tflite: 1 constant\(s\) of >= 64 KiB stayed float"
    ):
        quantize_tflite(float_dir, tmp_path / "pi", scheme="dynamic", profile=pi_profile())
    assert not (tmp_path / "pi").exists()


def test_int8_files_share_quantization_parameters_and_drop_inner_names_with_identical_logits(
    tmp_path, tiny_tflite
):
    """Every signature is a subgraph that repeats each tensor's name and per-channel scales; the int8 file
    stores each distinct set of parameters once and short inner names, and computes exactly as before."""
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils

    from compress.quantize.tflite_compact import compact_tflite, compacted

    float_dir, calibration = tiny_tflite
    manifest = quantize_tflite(float_dir, tmp_path / "pi", scheme="dynamic", profile=pi_profile())
    for record in [manifest["quantization"], manifest["fallbacks"][0]["quantization"]]:
        compaction = record["compaction"]
        assert compaction["bytes_after"] < compaction["bytes_before"]
    primary = tmp_path / "pi" / "model.tflite"
    assert primary.stat().st_size == manifest["quantization"]["compaction"]["bytes_after"]
    model = tfl_flatbuffer_utils.read_model(str(primary))
    inner = [t.name for g in model.subgraphs for t in g.tensors]
    assert max(len(name) for name in inner) < 40  # module paths are gone; signature names stay
    assert {b"seq_16", b"seq_32"} == {s.signatureKey for s in model.signatureDefs}
    # an uncompacted copy of the same int8 model computes bit-identically to the compacted one
    original = tmp_path / "original.tflite"
    q = build_quantizer(float_dir / "model.tflite", "dynamic", True, [], False)
    write_model(q, "dynamic", None, original)
    assert original.stat().st_size > primary.stat().st_size
    feeds = {key: samples[0] for key, samples in calibration.items()}
    assert _signature_logits(original, feeds).keys() == {"seq_16", "seq_32"}
    for key, want in _signature_logits(original, feeds).items():
        np.testing.assert_array_equal(_signature_logits(primary, feeds)[key], want)
    # sharing is real: one parameters object serves the same weight in every subgraph
    shared = compacted(tfl_flatbuffer_utils.read_model(str(original)))
    params = [t.quantization for g in shared.subgraphs for t in g.tensors if t.quantization is not None]
    assert len({id(p) for p in params}) < len(params)
    # a second pass finds nothing left to drop and keeps the file as it is
    again = compact_tflite(primary)
    assert again["bytes_after"] == again["bytes_before"] == primary.stat().st_size


def _signature_logits(path, feeds):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    return {key: interpreter.get_signature_runner(key)(**inputs)["logits"] for key, inputs in feeds.items()}


def test_a_compacted_model_that_computes_differently_is_refused(tmp_path, tiny_tflite, monkeypatch):
    """The rewrite is checked, not trusted: logits that change fail quantize with one line, and the
    original file is left as it was."""
    import compress.quantize.tflite_compact as compact

    float_dir, _ = tiny_tflite
    path = tmp_path / "model.tflite"
    write_model(
        build_quantizer(float_dir / "model.tflite", "dynamic", True, [], False), "dynamic", None, path
    )
    before = path.read_bytes()
    real = compact._logits
    calls = []

    def drifting(p, feeds):
        out = real(p, feeds)
        calls.append(p)
        return {k: v + 1e-3 for k, v in out.items()} if len(calls) == 2 else out

    monkeypatch.setattr(compact, "_logits", drifting)
    with pytest.raises(ExportError, match="compacted model's logits differ"):
        compact.compact_tflite(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.tflite"]


def test_a_compaction_that_cannot_run_is_one_line_and_leaves_the_file(tmp_path, tiny_tflite, monkeypatch):
    """Anything failing inside the rewrite (here the writer) is an ExportError line, not a traceback,
    and neither the model nor a scratch file is changed or left behind."""
    import compress.quantize.tflite_compact as compact

    float_dir, _ = tiny_tflite
    path = tmp_path / "model.tflite"
    q = build_quantizer(float_dir / "model.tflite", "dynamic", True, [], False)
    write_model(q, "dynamic", None, path)
    before = path.read_bytes()

    def broken(model, target):
        target.write_bytes(b"partial")
        raise ValueError("flatbuffer too large\nsecond line")

    monkeypatch.setattr(compact, "_write", broken)
    with pytest.raises(
        ExportError, match=r"compacting the int8 model failed \(ValueError: flatbuffer too large\)"
    ) as info:
        compact.compact_tflite(path)
    assert "\n" not in str(info.value)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.tflite"]
    # a model with no signature has nothing to compare against, so it is left as written
    monkeypatch.setattr(compact, "_probe_feeds", lambda p: {})
    assert compact.compact_tflite(path) == {"bytes_before": len(before), "bytes_after": len(before)}
    assert path.read_bytes() == before
