"""The int8 check: large float constants fail an int8 artifact unless their readers are float on purpose."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from compress.errors import ExportError
from compress.export.onnx import fold_weight_transposes
from compress.export.tflite import positions_from_mask
from compress.models import load_classifier
from compress.quantize.constants import LARGE, onnx_float_constants, require_int8_constants


def _shared_transpose_graph(weight: np.ndarray) -> onnx.ModelProto:
    """``y = x @ W.T @ W.T`` with one Transpose node per use of the one initializer ``W``."""
    nodes = [
        helper.make_node("Transpose", ["W"], ["Wt1"], name="t1", perm=[1, 0]),
        helper.make_node("MatMul", ["x", "Wt1"], ["h"], name="m1"),
        helper.make_node("Transpose", ["W"], ["Wt2"], name="t2", perm=[1, 0]),
        helper.make_node("MatMul", ["h", "Wt2"], ["y"], name="m2"),
    ]
    n = weight.shape[0]
    graph = helper.make_graph(
        nodes,
        "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [numpy_helper.from_array(weight, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["y"], {"x": x})[0]


def test_fold_weight_transposes_stores_a_shared_weight_once_pre_transposed():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((8, 8)).astype(np.float32)
    model = _shared_transpose_graph(weight)
    x = rng.standard_normal((1, 8)).astype(np.float32)
    expected = _run(model, x)
    assert fold_weight_transposes(model) == 2
    assert [n.op_type for n in model.graph.node] == ["MatMul", "MatMul"]
    assert [i.name for i in model.graph.initializer] == ["W_Transposed"]
    np.testing.assert_array_equal(numpy_helper.to_array(model.graph.initializer[0]), weight.T)
    np.testing.assert_allclose(_run(model, x), expected, rtol=1e-6)
    onnx.checker.check_model(model)


def test_fold_weight_transposes_keeps_a_weight_something_else_reads_untransposed():
    weight = np.ones((4, 4), np.float32)
    model = _shared_transpose_graph(weight)
    model.graph.node.append(helper.make_node("Identity", ["W"], ["W_copy"], name="copy"))
    fold_weight_transposes(model)
    assert sorted(i.name for i in model.graph.initializer) == ["W", "W_Transposed"]


def test_large_float_constants_are_found_unless_only_float_nodes_read_them(tmp_path):
    side = 128  # 128 x 128 float32 = 64 KiB, the threshold itself
    model = _shared_transpose_graph(np.ones((side, side), np.float32))
    fold_weight_transposes(model)
    onnx.save(model, tmp_path / "model.onnx")
    assert onnx_float_constants(tmp_path / "model.onnx") == {"W_Transposed": LARGE}
    readers = [n.name for n in model.graph.node]
    assert onnx_float_constants(tmp_path / "model.onnx", readers) == {}
    assert onnx_float_constants(tmp_path / "model.onnx", readers[:1]) == {"W_Transposed": LARGE}


def test_require_int8_constants_names_the_artifact_the_size_and_the_fix():
    require_int8_constants("a", {})
    with pytest.raises(ExportError) as err:
        require_int8_constants("02-quantize/arm64-onnx-int8", {"w1": LARGE, "big/scope/w2": 2 * LARGE})
    text = str(err.value)
    assert "\n" not in text
    assert "02-quantize/arm64-onnx-int8: 2 constant(s)" in text
    assert "196,608 bytes; largest w2, 131,072 bytes" in text
    assert "float_layers" in text


def test_quantize_onnx_fails_an_artifact_whose_matmul_weights_stay_float(tmp_path):
    from compress.export.onnx import export_onnx
    from compress.quantize.onnx import quantize_onnx
    from compress.targets import load_target
    from tests.helpers.tiny import make_tiny_bert

    model, tokenizer = load_classifier(make_tiny_bert(tmp_path / "m", hidden=128))
    export_onnx(model, tokenizer, tmp_path / "fp32", load_target("arm64-onnx"), max_length=16)
    with pytest.raises(ExportError, match="stayed float"):
        quantize_onnx(tmp_path / "fp32", tmp_path / "int8", scheme="dynamic", op_types=["Gather"])
    assert not (tmp_path / "int8").exists()
    layers = [f"bert.encoder.layer.{i}" for i in range(2)] + ["bert.pooler"]
    manifest = quantize_onnx(tmp_path / "fp32", tmp_path / "int8", scheme="dynamic", float_layers=layers)
    assert manifest["quantization"]["float_constant_bytes"] >= 8 * LARGE  # kept float on purpose


def test_positions_from_mask_match_the_table_on_real_tokens_and_restore_the_model(tiny_bert_dir):
    import torch

    from compress.export import Classifier

    model, tokenizer = load_classifier(tiny_bert_dir)
    module = Classifier(model.eval(), additive_mask=True).eval()
    batch = tokenizer(["short", "a somewhat longer sentence here"], padding=True, return_tensors="pt")
    with torch.no_grad():
        before = module(**batch)["logits"]
        with positions_from_mask(module):
            table = model.bert.embeddings.position_embeddings
            assert "forward" in module.__dict__ and "forward" in table.__dict__
            during = module(**batch)["logits"]
    torch.testing.assert_close(during, before, rtol=1e-5, atol=1e-5)
    assert "forward" not in module.__dict__ and "forward" not in table.__dict__


@pytest.mark.slow
def test_full_integer_tflite_stores_the_lookup_tables_int8_too(tmp_path):
    from compress.export import SAMPLE_TEXTS, input_names
    from compress.export.tflite import export_tflite
    from compress.quantize.constants import tflite_float_constants
    from compress.quantize.tflite import quantize_tflite, signature_feeds
    from compress.targets import load_target
    from tests.helpers.tiny import make_tiny_bert

    model, tokenizer = load_classifier(make_tiny_bert(tmp_path / "m", hidden=128))
    manifest = export_tflite(model, tokenizer, tmp_path / "fp32", load_target("raspberry-pi-4"))
    feeds = signature_feeds(
        tokenizer, input_names(model), SAMPLE_TEXTS * 2, None, manifest["sequence_lengths"]
    )
    out = quantize_tflite(
        tmp_path / "fp32", tmp_path / "int8", scheme="static", calibration=feeds, full_integer=True
    )
    assert tflite_float_constants(tmp_path / "int8" / "model.tflite") == {}
    assert out["quantization"]["float_constant_bytes"] == 0


def test_fold_weight_transposes_leaves_an_overridable_input_default_alone():
    model = _shared_transpose_graph(np.ones((4, 4), np.float32))
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 4]))
    assert fold_weight_transposes(model) == 0
    assert [n.op_type for n in model.graph.node].count("Transpose") == 2


def test_fold_weight_transposes_keeps_a_weight_that_is_also_a_graph_output():
    model = _shared_transpose_graph(np.ones((4, 4), np.float32))
    model.graph.output.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 4]))
    fold_weight_transposes(model)
    assert sorted(i.name for i in model.graph.initializer) == ["W", "W_Transposed"]
    onnx.checker.check_model(model)


def test_int4_lookup_table_counts_as_quantized_and_its_block_scales_are_part_of_it(tmp_path):
    from compress.quantize.onnx import store_tables_int4

    rng = np.random.default_rng(0)
    table = rng.normal(size=(4096, 64)).astype(np.float32)  # 1 MiB float; scales [4096, 4] = 64 KiB
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], name="lookup")],
        "lookup",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None, 64])],
        [numpy_helper.from_array(table, "table")],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert onnx_float_constants(path) == {"table": table.nbytes}

    stored = store_tables_int4(path, block_size=16, lookup="blocked")
    assert stored["tables"] == ["table"] and stored["bits"] == 4
    assert onnx_float_constants(path) == {}
    scales = [i for i in onnx.load(str(path)).graph.initializer if i.data_type == TensorProto.FLOAT]
    assert scales and sum(4 * int(np.prod(s.dims)) for s in scales) >= LARGE  # large, and still not flagged
    import onnxruntime as ort

    ids = np.array([[0, 5, 4095, 17]], np.int64)
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    # 16 levels over each block's range: error at most half a step
    step = (table.max() - table.min()) / 15
    assert np.abs(got[0] - table[ids[0]]).max() <= step / 2 + 1e-6
    assert np.abs(got[0] - table[ids[0]]).max() > 0  # it is really int4, not the float table


def test_int4_tables_need_a_float_lookup_to_store(tmp_path):
    from compress.quantize.onnx import store_tables_int4

    model = _shared_transpose_graph(np.ones((8, 8), np.float32))
    onnx.save(model, tmp_path / "model.onnx")
    with pytest.raises(ExportError, match="found no float embedding table"):
        store_tables_int4(tmp_path / "model.onnx", block_size=16, lookup="blocked")
