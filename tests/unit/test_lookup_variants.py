"""benchmarks/lookup_variants.py on a tiny int4-table artifact: the rewrite computes what the file does."""

from __future__ import annotations

import onnx
import pytest

from benchmarks.lookup_variants import VARIANTS, compare, dequantized_lookups
from compress.export.onnx import export_onnx
from compress.models import load_classifier
from compress.quantize.onnx import quantize_onnx
from compress.targets import load_target


def test_dequantized_lookups_give_the_stored_files_logits_with_and_without_folding(tmp_path, tiny_bert_dir):
    model, tokenizer = load_classifier(tiny_bert_dir)
    fp32, int8 = tmp_path / "fp32", tmp_path / "int8"
    export_onnx(model, tokenizer, fp32, load_target("arm64-onnx"), name="fp32")
    blocked = {"embedding_bits": 4, "embedding_lookup": "blocked"}
    quantize_onnx(fp32, int8, scheme="dynamic", per_channel=True, **blocked)
    stored = onnx.load(str(int8 / "model.onnx"))
    lookups = sum(n.op_type == "GatherBlockQuantized" for n in stored.graph.node)
    assert lookups >= 1

    rewritten = dequantized_lookups(stored)
    ops = [n.op_type for n in rewritten.graph.node]
    assert "GatherBlockQuantized" not in ops and ops.count("DequantizeLinear") == lookups
    assert {i.name for i in rewritten.graph.initializer} == {i.name for i in stored.graph.initializer}

    out = compare(int8 / "model.onnx", threads=1, rounds=2, repeats=1, lengths=[5, 9])
    assert list(out["variants"]) == list(VARIANTS) and out["model"] == "model.onnx"
    for name in VARIANTS:
        assert out["variants"][name]["max_abs_logit_diff"] < 1e-4
        assert len(out["variants"][name]["rounds_us"]) == 2

    with pytest.raises(SystemExit, match="no GatherBlockQuantized node"):
        dequantized_lookups(onnx.load(str(fp32 / "model.onnx")))


def test_attention_layouts_times_both_layouts_with_the_same_outputs(tiny_bert_dir):
    from benchmarks.attention_layouts import compare as layouts

    out = layouts(tiny_bert_dir, threads=1, rounds=2, repeats=1, lengths=[5, 9], embedding_bits=4)
    assert set(out["variants"]) == {"separate int8", "packed int8", "separate fp32", "packed fp32"}
    variants = out["variants"]
    assert variants["packed int8"]["max_abs_logit_diff"] < 1e-4  # same int8 arithmetic, one kernel
    assert all(len(v["rounds_us"]) == 2 and v["bytes"] > 0 for v in variants.values())
