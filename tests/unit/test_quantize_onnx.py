"""ONNX int8 with onnxruntime.quantization: dynamic and static QDQ, safe op types, exclusions, errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from compress.errors import ExportError
from compress.export import SAMPLE_TEXTS, encode_batch, input_names
from compress.export.onnx import export_onnx
from compress.models import load_classifier
from compress.quantize import predict_logits
from compress.quantize.onnx import float_lookup_tables, nodes_in_layers, quantize_onnx
from compress.targets import load_target


@pytest.fixture(scope="module")
def float_dir(tiny_bert_dir, tmp_path_factory):
    model, tokenizer = load_classifier(tiny_bert_dir)
    folder = tmp_path_factory.mktemp("onnx") / "fp32"
    export_onnx(model, tokenizer, folder, load_target("arm64-onnx"), name="01-export/fp32")
    return folder


@pytest.fixture(scope="module")
def calibration(tiny_bert_dir):
    model, tokenizer = load_classifier(tiny_bert_dir)
    texts = SAMPLE_TEXTS * 4
    return [
        encode_batch(tokenizer, texts[i : i + 8], None, input_names(model), length=24, max_length=24)
        for i in range(0, len(texts), 8)
    ]


def quantize_nodes_serve_only(path, op_types: set[str]) -> bool:
    """Every activation QuantizeLinear sits on the input or the output of one of ``op_types``."""
    graph = onnx.load(str(path)).graph
    producer = {o: n.op_type for n in graph.node for o in n.output}
    consumers: dict[str, list[str]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.op_type)
    dq_of = {n.input[0]: n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    quantize = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    return bool(quantize) and all(
        producer.get(q.input[0]) in op_types or op_types & set(consumers.get(dq_of.get(q.output[0], ""), []))
        for q in quantize
    )


def test_dynamic_int8_is_smaller_and_close_to_float(tmp_path, float_dir):
    manifest = quantize_onnx(float_dir, tmp_path / "int8", scheme="dynamic", name="02-quantize/int8")
    assert manifest["precision"] == "int8" and manifest["name"] == "02-quantize/int8"
    assert manifest["quantization"]["scheme"] == "dynamic"
    assert manifest["quantization"]["granularity"] == "per-channel"
    assert manifest["inputs"] == read_inputs(float_dir)
    assert {e["path"] for e in manifest["files"]} == {"model.onnx", "tokenizer.json", "labels.json"}
    assert (tmp_path / "int8" / "model.onnx").stat().st_size < (float_dir / "model.onnx").stat().st_size
    got, ref = (
        predict_logits(tmp_path / "int8", SAMPLE_TEXTS, None),
        predict_logits(float_dir, SAMPLE_TEXTS, None),
    )
    assert np.abs(got - ref).max() < 0.05


def read_inputs(folder):
    from compress.io import read_json

    return read_json(folder / "manifest.json")["inputs"]


def test_static_quantizes_matmuls_and_stores_embedding_tables_int8_by_default(
    tmp_path, float_dir, calibration
):
    manifest = quantize_onnx(
        float_dir, tmp_path / "s", scheme="static", calibration=calibration, method="minmax"
    )
    assert manifest["quantization"]["op_types"] == ["MatMul", "Gemm", "Gather"]
    assert manifest["quantization"]["calibration"] == {"samples": 24, "method": "minmax"}
    assert quantize_nodes_serve_only(tmp_path / "s" / "model.onnx", {"MatMul", "Gemm", "Gather"})
    # the embedding tables are stored int8: no lookup reads a float table any more
    assert float_lookup_tables(float_dir / "model.onnx")
    assert not float_lookup_tables(tmp_path / "s" / "model.onnx")
    got, ref = (
        predict_logits(tmp_path / "s", SAMPLE_TEXTS, None),
        predict_logits(float_dir, SAMPLE_TEXTS, None),
    )
    assert np.abs(got - ref).max() < 0.05


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_histogram_calibration_methods_run(tmp_path, float_dir, calibration, method):
    manifest = quantize_onnx(
        float_dir, tmp_path / method, scheme="static", calibration=calibration, method=method
    )
    assert manifest["quantization"]["calibration"]["method"] == method


def test_float_layers_keep_their_nodes_float(tmp_path, float_dir, calibration):
    layer_nodes = nodes_in_layers(float_dir / "model.onnx", ["bert.encoder.layer.1"])
    assert layer_nodes
    manifest = quantize_onnx(
        float_dir,
        tmp_path / "f",
        scheme="static",
        calibration=calibration,
        float_layers=["bert.encoder.layer.1"],
    )
    assert set(layer_nodes) <= set(manifest["quantization"]["excluded_nodes"])
    graph = onnx.load(str(tmp_path / "f" / "model.onnx")).graph
    dq_outputs = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    kept = [n for n in graph.node if n.name in layer_nodes and n.op_type == "MatMul"]
    assert kept and not any(dq_outputs & set(n.input) for n in kept)


def test_unknown_excluded_node_is_an_error(tmp_path, float_dir):
    with pytest.raises(ExportError, match=r"exclude_nodes: .*not nodes of model\.onnx"):
        quantize_onnx(float_dir, tmp_path / "x", scheme="dynamic", exclude_nodes=["no_such_node"])


def test_static_needs_calibration_and_a_known_method(tmp_path, float_dir, calibration):
    with pytest.raises(ExportError, match="calibration samples"):
        quantize_onnx(float_dir, tmp_path / "x", scheme="static")
    with pytest.raises(ExportError, match=r"calibration\.method 'mse'"):
        quantize_onnx(float_dir, tmp_path / "x", scheme="static", calibration=calibration, method="mse")
    assert not (tmp_path / "x").exists()


def lookup_tables(path) -> dict[str, np.dtype]:
    """The int4 tables the graph reads (by GatherBlockQuantized, or by the Cast of a folded lookup),
    with their stored element type."""
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    inits = {i.name: i for i in graph.initializer}
    return {
        n.input[0]: numpy_helper.to_array(inits[n.input[0]]).dtype
        for n in graph.node
        if n.op_type in ("GatherBlockQuantized", "Cast") and n.input[0] in inits and "zero" not in n.name
    }


@pytest.mark.parametrize("scheme", ["dynamic", "static"])
@pytest.mark.parametrize("lookup", ["fold", "blocked"])
def test_embedding_bits_4_stores_every_lookup_table_int4_in_blocks(
    tmp_path, float_dir, calibration, scheme, lookup
):
    eight = quantize_onnx(
        float_dir, tmp_path / "int8", scheme=scheme, calibration=calibration if scheme == "static" else None
    )
    four = quantize_onnx(
        float_dir,
        tmp_path / "int4",
        scheme=scheme,
        calibration=calibration if scheme == "static" else None,
        embedding_bits=4,
        embedding_block=16,
        embedding_lookup=lookup,
    )
    assert eight["quantization"]["embedding"] == {"bits": 8, "float_tables": []}
    stored = four["quantization"]["embedding"]
    assert stored["bits"] == 4 and stored["block_size"] == 16 and stored["tables"]
    assert stored["lookup"] == lookup
    tables = lookup_tables(tmp_path / "int4" / "model.onnx")
    assert len(tables) == len(stored["tables"]) == len(float_lookup_tables(float_dir / "model.onnx"))
    assert {str(t) for t in tables.values()} == {"uint4"}  # asymmetric: a zero point per block
    ops = {n.op_type for n in onnx.load(str(tmp_path / "int4" / "model.onnx")).graph.node}
    assert ("GatherBlockQuantized" in ops) == (lookup == "blocked")
    # no lookup reads a float (or an int8) table any more, and the matmuls are still int8
    assert not float_lookup_tables(tmp_path / "int4" / "model.onnx")
    assert ops & {"MatMulInteger", "DynamicQuantizeMatMul", "QuantizeLinear"}
    size = (tmp_path / "int4" / "model.onnx").stat().st_size
    assert size < (tmp_path / "int8" / "model.onnx").stat().st_size
    got, ref = (
        predict_logits(tmp_path / "int4", SAMPLE_TEXTS, None),
        predict_logits(float_dir, SAMPLE_TEXTS, None),
    )
    assert np.abs(got - ref).max() < 0.1
    onnx.checker.check_model(str(tmp_path / "int4" / "model.onnx"))


@pytest.mark.parametrize("block", [16, 64])  # the tables are 32 wide: whole blocks, then one padded block
def test_folded_lookups_are_plain_gathers_at_run_time_with_the_blocked_logits(tmp_path, float_dir, block):
    import onnxruntime as ort

    made = {}
    for lookup in ("fold", "blocked"):
        made[lookup] = quantize_onnx(
            float_dir,
            tmp_path / lookup,
            scheme="dynamic",
            embedding_bits=4,
            embedding_block=block,
            embedding_lookup=lookup,
        )
    fold, blocked = made["fold"]["quantization"]["embedding"], made["blocked"]["quantization"]["embedding"]
    assert fold["tables"] == blocked["tables"]
    # the same int4 bytes (and a padded block's padding): larger only by a few small constant nodes
    sizes = {k: (tmp_path / k / "model.onnx").stat().st_size for k in made}
    stored = onnx.load(str(tmp_path / "fold" / "model.onnx")).graph.initializer
    rows = sum(i.dims[0] for i in stored if i.data_type == onnx.TensorProto.UINT4 and i.dims[-1] == block)
    padding = rows * (-(-32 // block) * block - 32) // 2  # int4: two values a byte
    assert 0 < sizes["fold"] - sizes["blocked"] - padding < 4096
    # every constant the fold wrote is read (ONNX Runtime warns at every load about unused ones)
    nodes = onnx.load(str(tmp_path / "fold" / "model.onnx")).graph.node
    read = {name for node in nodes for name in node.input}
    assert [i.name for i in stored if i.name not in read] == []
    got, ref = (predict_logits(tmp_path / k, SAMPLE_TEXTS, None) for k in ("fold", "blocked"))
    assert np.abs(got - ref).max() < 1e-5
    # what ONNX Runtime runs after loading with its default options: float tables and plain lookups
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "as-run.onnx")
    ort.InferenceSession(str(tmp_path / "fold" / "model.onnx"), options, providers=["CPUExecutionProvider"])
    graph = onnx.load(str(tmp_path / "as-run.onnx")).graph
    four_bit = [i.name for i in graph.initializer if i.data_type in (onnx.TensorProto.UINT4, 22)]  # 22: INT4
    assert not four_bit and "GatherBlockQuantized" not in {n.op_type for n in graph.node}
    assert len(float_lookup_tables(tmp_path / "as-run.onnx")) == len(fold["tables"])


def test_an_unknown_embedding_lookup_is_an_error(tmp_path, float_dir):
    with pytest.raises(ExportError, match="embedding_lookup 'packed' is not one of"):
        quantize_onnx(
            float_dir, tmp_path / "q", scheme="dynamic", embedding_bits=4, embedding_lookup="packed"
        )
    assert not (tmp_path / "q").exists()


def test_embedding_bits_4_with_gather_left_float_is_an_error(tmp_path, float_dir):
    with pytest.raises(ExportError, match="op_types leaves Gather float"):
        quantize_onnx(float_dir, tmp_path / "q", scheme="dynamic", op_types=["MatMul"], embedding_bits=4)
    assert not (tmp_path / "q").exists()


def test_embedding_bits_4_leaves_an_excluded_lookup_float_and_says_so(tmp_path, float_dir):
    graph = onnx.load(str(float_dir / "model.onnx")).graph
    lookups = [
        n
        for n in graph.node
        if n.op_type == "Gather" and n.input[0] in float_lookup_tables(float_dir / "model.onnx")
    ]
    kept = lookups[0]
    manifest = quantize_onnx(
        float_dir,
        tmp_path / "q",
        scheme="dynamic",
        exclude_nodes=[kept.name],
        embedding_bits=4,
        embedding_block=16,
    )
    embedding = manifest["quantization"]["embedding"]
    assert embedding["float_tables"] == [kept.input[0]]
    assert kept.input[0] not in embedding["tables"] and len(embedding["tables"]) == len(lookups) - 1
    assert float_lookup_tables(tmp_path / "q" / "model.onnx") == [kept.input[0]]
