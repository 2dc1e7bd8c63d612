"""Fused ONNX artifacts: ORT's transformer fusions recorded, checked against PyTorch, and quantizable.

The models are wide enough (hidden 128) that their projection weights reach the constants check's
64 KiB, so an int8 artifact whose fused ops left a weight float fails here as it would in a run.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pytest
import torch

from compress.errors import ExportError
from compress.export import SAMPLE_TEXTS
from compress.export.check import ATOL
from compress.export.onnx import export_onnx
from compress.models import load_classifier
from compress.quantize.constants import onnx_float_constants
from compress.quantize.onnx import quantize_onnx, torchscript_scope
from compress.targets import load_target
from tests.helpers.tiny import make_tiny_bert


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory: pytest.TempPathFactory):
    return make_tiny_bert(tmp_path_factory.mktemp("wide"), layers=2, hidden=128)


@pytest.fixture(scope="module")
def fused_dir(tmp_path_factory: pytest.TempPathFactory, wide_dir):
    model, tokenizer = load_classifier(wide_dir)
    folder = tmp_path_factory.mktemp("fused") / "fp32"
    export_onnx(model, tokenizer, folder, load_target("arm64-onnx"), name="01-export/fp32", fuse=True)
    return folder


def op_counts(path) -> Counter:
    import onnx

    return Counter(node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node)


def session_op_counts(path, tmp_path) -> Counter:
    """Op counts of the graph an ONNX Runtime session runs after its default load-time optimizations."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "session-optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return op_counts(tmp_path / "session-optimized.onnx")


def test_split_skip_layer_norm_computes_the_contrib_op(tmp_path):
    """The split (Add, Add, LayerNormalization) against ONNX Runtime's own SkipLayerNormalization on the
    same inputs, with the bias and the input+skip+bias sum output, and a graph without the bias."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from compress.export.onnx import split_skip_layer_norms

    rng = np.random.default_rng(0)
    hidden = 16
    weights = {
        name: numpy_helper.from_array(rng.normal(size=hidden).astype(np.float32), name)
        for name in ("gamma", "beta", "bias")
    }

    def graph(with_bias: bool):
        inputs = ["x", "skip", "gamma", "beta"] + (["bias"] if with_bias else [])
        outputs = ["y", "", "", "sum"] if with_bias else ["y"]
        node = helper.make_node(
            "SkipLayerNormalization", inputs, outputs, name="sln", domain="com.microsoft", epsilon=1e-5
        )
        tensor = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, hidden]) for n in ("x", "skip")]
        out = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, hidden]) for n in outputs if n]
        used = [weights[n] for n in inputs if n in weights]
        return helper.make_model(
            helper.make_graph([node], "g", tensor, out, used),
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        )

    feeds = {n: rng.normal(size=(2, 3, hidden)).astype(np.float32) for n in ("x", "skip")}
    for with_bias in (True, False):
        contrib = graph(with_bias)
        split = graph(with_bias)
        assert split_skip_layer_norms(split) == 1
        assert Counter(n.op_type for n in split.graph.node) == {
            "Add": 2 if with_bias else 1,
            "LayerNormalization": 1,
        }
        onnx.checker.check_model(split)
        results = [
            ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
            for m in (contrib, split)
        ]
        for expected, got in zip(*results, strict=True):
            np.testing.assert_allclose(got, expected, atol=1e-5)
    old = graph(True)
    old.opset_import[0].version = 16  # no standard LayerNormalization: the contrib op stays
    assert split_skip_layer_norms(old) == 0 and old.graph.node[0].op_type == "SkipLayerNormalization"


def test_first_token_only_keeps_the_logits_and_refuses_graphs_that_read_other_rows(
    tmp_path, wide_dir, monkeypatch
):
    """On the full fused graph (the rewrite switched off during export): the narrowed graph gives the
    same logits at several shapes; a hidden state also read elsewhere, or a head that reads another
    position, leaves the graph as it was and says why."""
    import onnx
    import onnxruntime as ort

    import compress.export.onnx as onnx_export

    monkeypatch.setattr(onnx_export, "first_token_only", lambda model: "switched off by the test")
    model, tokenizer = load_classifier(wide_dir)
    manifest = export_onnx(model, tokenizer, tmp_path / "full", load_target("arm64-onnx"), fuse=True)
    assert manifest["fusion"]["first_token_only"] == {"applied": False, "reason": "switched off by the test"}
    monkeypatch.undo()
    full = onnx.load(str(tmp_path / "full" / "model.onnx"))

    def logits(graph, texts):
        enc = tokenizer(texts, padding=True, return_tensors="np")
        session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(["logits"], {k: enc[k].astype(np.int64) for k in manifest_inputs})[0]

    manifest_inputs = [i["name"] for i in manifest["inputs"]]
    narrowed = onnx.ModelProto()
    narrowed.CopyFrom(full)
    assert onnx_export.first_token_only(narrowed) == 10
    for texts in (SAMPLE_TEXTS[:1], SAMPLE_TEXTS):
        np.testing.assert_allclose(logits(narrowed, texts), logits(full, texts), atol=1e-5)

    read_elsewhere = onnx.ModelProto()
    read_elsewhere.CopyFrom(full)
    last_norm = [n for n in read_elsewhere.graph.node if n.op_type == "LayerNormalization"][-1]
    read_elsewhere.graph.output.append(onnx.helper.make_empty_tensor_value_info(last_norm.output[0]))
    assert "is read outside the layer" in onnx_export.first_token_only(read_elsewhere)

    other_row = onnx.ModelProto()
    other_row.CopyFrom(full)
    select = onnx_export._first_token_select(other_row.graph)
    index = next(i for i in other_row.graph.node if select.input[1] in i.output)
    index.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(np.array(1, np.int64)))
    assert "does not read the first token alone" in onnx_export.first_token_only(other_row)


def calibration(tokenizer) -> list[dict[str, np.ndarray]]:
    enc = tokenizer(SAMPLE_TEXTS, padding="max_length", max_length=24, truncation=True, return_tensors="np")
    return [{k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}]


def runner_logits(folder) -> np.ndarray:
    from compress.runtime.runner import load

    return load(folder).predict_logits(SAMPLE_TEXTS, batch_size=3)


def test_fused_export_records_its_fusions_and_matches_pytorch(fused_dir, wide_dir):
    from compress.io import read_json

    manifest = read_json(fused_dir / "manifest.json")
    fusion = manifest["fusion"]
    assert fusion["applied"] and "reason" not in fusion
    assert fusion["ops"]["MultiHeadAttention"] == 2
    assert fusion["ops"]["BiasGelu"] == 2 and fusion["ops"]["LayerNormalization"] >= 5
    # the fused skip-layer-norms are split back into Add, Add, LayerNormalization (faster kernels)
    assert fusion["split"]["SkipLayerNormalization"] >= 4 and "SkipLayerNormalization" not in fusion["ops"]
    # the head reads token 0 alone, so the last layer runs on that row after its attention
    assert fusion["first_token_only"] == {"applied": True, "nodes": 10}
    ops = op_counts(fused_dir / "model.onnx")
    assert ops["SkipLayerNormalization"] == 0 and ops["Slice"] >= 3
    assert ops["LayerNormalization"] == fusion["ops"]["LayerNormalization"]
    assert ops["MultiHeadAttention"] == 2 and ops["Softmax"] == 0  # the graph holds what the record says
    assert ops["EmbedLayerNormalization"] == 0 and ops["Gather"] >= 3  # lookups left for int8/int4 tables
    # the runtime contract is unchanged: names, int64, dynamic batch and sequence
    assert [i["name"] for i in manifest["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(i["dtype"] == "int64" and i["shape"] == ["batch", "sequence"] for i in manifest["inputs"])
    # the export check ran on the fused graph, at several shapes, within tolerance
    assert len({tuple(s) for s in manifest["check"]["shapes"]}) >= 3
    assert manifest["check"]["max_abs_diff"] <= ATOL
    # padded batches through the on-device runner: the raw mask is honoured
    model, tokenizer = load_classifier(wide_dir)
    enc = tokenizer(SAMPLE_TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model(**enc).logits.numpy()
    np.testing.assert_allclose(runner_logits(fused_dir), expected, atol=1e-4)


def test_fuse_false_writes_the_unfused_graph(tmp_path, wide_dir):
    model, tokenizer = load_classifier(wide_dir)
    manifest = export_onnx(model, tokenizer, tmp_path / "plain", load_target("arm64-onnx"))
    assert manifest["fusion"] == {"requested": False, "applied": False}
    assert op_counts(tmp_path / "plain" / "model.onnx")["MultiHeadAttention"] == 0


def test_attention_that_does_not_fuse_falls_back_to_the_unfused_graph_and_says_why(
    tmp_path, wide_dir, monkeypatch, caplog
):
    import compress.export.onnx as onnx_export

    options = onnx_export.fusion_options

    def without_attention(attention):
        chosen = options(attention)
        chosen.enable_attention = False
        return chosen

    monkeypatch.setattr(onnx_export, "fusion_options", without_attention)
    model, tokenizer = load_classifier(wide_dir)
    with caplog.at_level(logging.WARNING, logger="compress.export.onnx"):
        manifest = export_onnx(model, tokenizer, tmp_path / "fallback", load_target("arm64-onnx"), fuse=True)
    fusion = manifest["fusion"]
    assert fusion["requested"] and not fusion["applied"]
    assert "fused attention in 0 of 2 layers" in fusion["reason"]
    assert "writing the unfused graph" in caplog.text and "0 of 2 layers" in caplog.text
    assert not any(
        op.startswith(("Skip", "Bias", "MultiHead")) for op in op_counts(tmp_path / "fallback" / "model.onnx")
    )


def test_a_fused_graph_that_fails_the_export_check_is_not_shipped(tmp_path, wide_dir, monkeypatch):
    import compress.export.onnx as onnx_export

    fuse_graph = onnx_export.fuse_graph

    def wrong_fusion(path, config, attention):
        import onnx
        from onnx import numpy_helper

        counts, split, first = fuse_graph(path, config, attention)
        model = onnx.load(str(path))
        bias = next(i for i in model.graph.initializer if "classifier.bias" in i.name)
        bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + 1.0, bias.name))
        onnx.save(model, str(path))
        return counts, split, first

    monkeypatch.setattr(onnx_export, "fuse_graph", wrong_fusion)
    model, tokenizer = load_classifier(wide_dir)
    manifest = export_onnx(model, tokenizer, tmp_path / "checked", load_target("arm64-onnx"), fuse=True)
    assert not manifest["fusion"]["applied"]
    assert "failed the export check" in manifest["fusion"]["reason"]
    assert manifest["check"]["max_abs_diff"] <= ATOL
    assert op_counts(tmp_path / "checked" / "model.onnx")["MultiHeadAttention"] == 0


@pytest.mark.parametrize("scheme", ["dynamic", "static"])
def test_fused_int8_stores_every_large_constant_int8_and_agrees(tmp_path, fused_dir, wide_dir, scheme):
    _, tokenizer = load_classifier(wide_dir)
    assert onnx_float_constants(fused_dir / "model.onnx")  # the check has weights to look at
    manifest = quantize_onnx(
        fused_dir,
        tmp_path / "int8",
        scheme=scheme,
        calibration=calibration(tokenizer) if scheme == "static" else None,
    )
    path = tmp_path / "int8" / "model.onnx"
    assert onnx_float_constants(path) == {}
    assert manifest["fusion"]["applied"]  # the int8 manifest says which graph it came from
    ops = op_counts(path)
    assert ops["MultiHeadAttention"] == 2
    assert (
        (ops["DynamicQuantizeMatMul"] + ops["MatMulInteger"])
        if scheme == "dynamic"
        else ops["DequantizeLinear"]
    )
    float_logits, int8_logits = runner_logits(fused_dir), runner_logits(tmp_path / "int8")
    assert np.abs(int8_logits - float_logits).max() < 0.1
    # what ONNX Runtime runs after its own load-time fusions: the split norms stay split
    assert session_op_counts(path, tmp_path)["SkipLayerNormalization"] == 0


@pytest.mark.parametrize("lookup", ["fold", "blocked"])
def test_fused_graph_takes_int4_embedding_tables(tmp_path, fused_dir, lookup):
    manifest = quantize_onnx(
        fused_dir, tmp_path / "int4", scheme="dynamic", embedding_bits=4, embedding_lookup=lookup
    )
    embedding = manifest["quantization"]["embedding"]
    assert any("word_embeddings" in t for t in embedding["tables"]) and embedding["float_tables"] == []
    ops = op_counts(tmp_path / "int4" / "model.onnx")
    assert ops["GatherBlockQuantized"] == (len(embedding["tables"]) if lookup == "blocked" else 0)
    assert len(embedding["tables"]) >= 3 and ops["MultiHeadAttention"] == 2
    assert np.isfinite(runner_logits(tmp_path / "int4")).all()


def test_packed_attention_becomes_qattention_in_dynamic_int8(tmp_path, fused_dir, wide_dir):
    """``attention: packed``: one packed query/key/value weight per layer (ORT's Attention), which
    dynamic int8 turns into QAttention with an int8 weight; same outputs as the separate layout."""
    model, tokenizer = load_classifier(wide_dir)
    target = load_target("arm64-onnx")
    manifest = export_onnx(model, tokenizer, tmp_path / "fp32", target, fuse=True, attention="packed")
    fusion = manifest["fusion"]
    assert fusion["applied"] and fusion["attention"] == "packed" and fusion["ops"]["Attention"] == 2
    ops = op_counts(tmp_path / "fp32" / "model.onnx")
    assert ops["Attention"] == 2 and ops["MultiHeadAttention"] == 0 and ops["Softmax"] == 0
    assert manifest["check"]["max_abs_diff"] <= ATOL
    np.testing.assert_allclose(runner_logits(tmp_path / "fp32"), runner_logits(fused_dir), atol=1e-4)
    int8 = quantize_onnx(tmp_path / "fp32", tmp_path / "int8", scheme="dynamic", embedding_bits=4)
    path = tmp_path / "int8" / "model.onnx"
    assert onnx_float_constants(path) == {}  # the packed weight is int8 too
    ops = op_counts(path)
    assert ops["QAttention"] == 2 and ops["Attention"] == 0
    assert len(int8["quantization"]["embedding"]["tables"]) >= 3
    assert np.abs(runner_logits(tmp_path / "int8") - runner_logits(tmp_path / "fp32")).max() < 0.1
    with pytest.raises(ExportError, match="attention 'stacked' is not one of separate, packed"):
        export_onnx(model, tokenizer, tmp_path / "bad", target, fuse=True, attention="stacked")
    assert not (tmp_path / "bad").exists()


def test_float_layers_map_to_the_fused_graph_and_a_fused_away_layer_is_an_error(tmp_path, fused_dir):
    manifest = quantize_onnx(
        fused_dir,
        tmp_path / "kept",
        scheme="dynamic",
        float_layers=["bert.encoder.layer.1.output.dense"],
    )
    assert manifest["quantization"]["excluded_nodes"] == ["/model/bert/encoder/layer.1/output/dense/MatMul"]
    with pytest.raises(ExportError, match=r"float_layers: .*layer.1.output.LayerNorm.*fuse: false"):
        quantize_onnx(
            fused_dir,
            tmp_path / "gone",
            scheme="dynamic",
            float_layers=["bert.encoder.layer.1.output.LayerNorm"],
        )
    assert not (tmp_path / "gone").exists()


def test_torchscript_scope_joins_list_indices():
    assert torchscript_scope("model.bert.encoder.layer.10.attention.self") == (
        "/model/bert/encoder/layer.10/attention/self/"
    )


@pytest.fixture(scope="module", params=["tied", "relaxed-rank-8"])
def shared_student(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, wide_dir):
    """A shared student as compress's share stage builds one: tied layers (optionally with low-rank
    corrections), a factorised embedding, a pruned-looking small vocabulary and trimmed positions."""
    from compress.share.factorize import factorize_embedding
    from compress.share.model import set_sharing_spec
    from compress.share.positions import trim_positions
    from compress.share.tying import make_plan, tie_layers

    model, tokenizer = load_classifier(
        make_tiny_bert(tmp_path_factory.mktemp("student"), layers=4, hidden=128)
    )
    plan = make_plan("all", 4, relax_rank=8 if request.param != "tied" else None)
    tie_layers(model, plan)
    torch.manual_seed(0)
    with torch.no_grad():  # a trained correction is not zero
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_(0, 0.02)
    factorize_embedding(model, 16)
    trim_positions(model, tokenizer, 32)
    set_sharing_spec(model, layers=plan.to_json(), embedding_rank=16)
    return request.param, model.eval(), tokenizer


@pytest.mark.slow
def test_shared_students_fuse_or_say_what_blocks_fusion(tmp_path, shared_student):
    kind, model, tokenizer = shared_student
    manifest = export_onnx(
        model, tokenizer, tmp_path / "fp32", load_target("arm64-onnx"), max_length=32, fuse=True
    )
    fusion = manifest["fusion"]
    assert manifest["check"]["max_abs_diff"] <= ATOL
    if kind == "tied":
        assert fusion["applied"] and fusion["ops"]["MultiHeadAttention"] == 4
        int8 = quantize_onnx(tmp_path / "fp32", tmp_path / "int8", scheme="dynamic", embedding_bits=4)
        assert onnx_float_constants(tmp_path / "int8" / "model.onnx") == {}
        assert int8["quantization"]["embedding"]["tables"]
        # packed: the tied layers' packed weights are one initializer, quantized once
        export_onnx(
            model,
            tokenizer,
            tmp_path / "packed",
            load_target("arm64-onnx"),
            max_length=32,
            fuse=True,
            attention="packed",
        )
        quantize_onnx(tmp_path / "packed", tmp_path / "packed8", scheme="dynamic", embedding_bits=4)
        packed = tmp_path / "packed8" / "model.onnx"
        assert onnx_float_constants(packed) == {} and op_counts(packed)["QAttention"] == 4
        assert packed.stat().st_size <= (tmp_path / "int8" / "model.onnx").stat().st_size
    else:
        assert not fusion["applied"] and "0 of 4 layers" in fusion["reason"], fusion
