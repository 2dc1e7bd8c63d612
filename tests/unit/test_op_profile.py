"""benchmarks/op_profile.py: per-kind kernel shares from ONNX Runtime's profiler, the warm-up left out,
and one real profile of a tiny exported artifact, in process and through the worker process."""

from __future__ import annotations

import pytest

from benchmarks import op_profile, render
from compress.export.onnx import export_onnx
from compress.models import load_classifier
from compress.targets import load_target
from tests.helpers.tiny import NEGATIVE, POSITIVE


def run(ts, dur):
    return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur}


def kernel(ts, node, op, dur):
    return {"cat": "Node", "name": f"{node}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}


def test_summary_leaves_out_warmup_and_groups_op_types_by_kind():
    events = [
        {"cat": "Session", "name": "session_initialization", "ts": 0, "dur": 5000},
        run(100, 1000),  # warm-up: its kernels must not count
        kernel(110, "mm_warm", "MatMul", 900),
        run(2000, 100),
        kernel(2010, "mm0", "DynamicQuantizeMatMul", 40),
        kernel(2050, "mm1", "DynamicQuantizeMatMul", 20),
        kernel(2070, "ln0", "SkipLayerNormalization", 10),
        kernel(2080, "x", "Reshape", 10),
        run(3000, 60),
        kernel(3010, "mm0", "DynamicQuantizeMatMul", 30),
        kernel(3040, "mm1", "DynamicQuantizeMatMul", 10),
        kernel(3050, "ln0", "SkipLayerNormalization", 10),
    ]
    out = op_profile.summarise(events, warmup=1)
    assert out["requests"] == 2
    assert out["run_us"] == 80.0 and out["kernel_us"] == 65.0
    assert out["outside_kernels"] == pytest.approx(1 - 65 / 80)
    assert out["kinds_us"]["matmul"] == 50.0
    assert out["kinds_us"]["layer norm"] == 10.0 and out["kinds_us"]["other"] == 5.0
    assert out["ops"][0] == {"op": "DynamicQuantizeMatMul", "kind": "matmul", "nodes": 2, "us": 50.0}
    assert [o["op"] for o in out["ops"]] == ["DynamicQuantizeMatMul", "SkipLayerNormalization", "Reshape"]

    with pytest.raises(ValueError, match="3 model runs, not more than the 3 warm-up runs"):
        op_profile.summarise(events, warmup=3)


def test_a_tiny_artifact_is_profiled_in_process_and_by_the_worker(tmp_path, tiny_bert_dir):
    model, tokenizer = load_classifier(tiny_bert_dir)
    folder = tmp_path / "onnx"
    export_onnx(model, tokenizer, folder, load_target("arm64-onnx"), name="export/arm64-onnx-fp32")
    texts = [f"{t} film" for t in POSITIVE[:3] + NEGATIVE[:3]]
    request = {"model": str(folder), "threads": 1, "texts": texts, "pairs": None, "warmup": 2, "samples": 5}

    out = op_profile.profile(request)
    assert out["requests"] == 5
    assert out["kinds_us"]["matmul"] > 0 and out["kinds_us"]["lookup"] > 0
    assert out["kernel_us"] <= out["run_us"]
    assert sum(out["kinds_us"].values()) == pytest.approx(out["kernel_us"], abs=0.1)

    onnx_row = {
        "row": "tiny · ONNX Runtime fp32",
        "entry": {"format": "onnx", "path": str(folder), "measured": {"threads": 1}},
    }
    torch_row = {
        "row": "tiny · PyTorch fp32",
        "entry": {"format": "torch", "path": str(tiny_bert_dir), "measured": {"threads": 1}},
    }
    op_profile.profile_rows([onnx_row, torch_row], texts, None, warmup=1, samples=4)
    assert onnx_row["op_profile"]["requests"] == 4 and "op_profile" not in torch_row

    table = render.op_table([onnx_row, torch_row])
    assert len(table) == 3 and table[2].startswith("| tiny · ONNX Runtime fp32 | ")
    assert render.op_table([torch_row]) == []


def test_a_broken_artifact_fails_the_worker_with_its_message(tmp_path):
    row = {
        "row": "x",
        "entry": {"format": "onnx", "path": str(tmp_path / "missing"), "measured": {"threads": 1}},
    }
    with pytest.raises(RuntimeError, match=r"profiling .*missing failed: "):
        op_profile.profile_rows([row], ["a"], None, warmup=0, samples=1)
