"""Where an ONNX artifact's runtime call goes, per kind of kernel: ONNX Runtime's own profiler.

The suite's per-part table says the runtime call is most of a batch-1 request; this says which kernels
take it. Each ONNX row's artifact is loaded in a process of its own (``python -m benchmarks.op_profile
REQUEST.json``) by the bundle runner with the session options it always uses, plus ONNX Runtime's
profiler; the dev requests run at batch 1 after warm-up, tokenised as in the timed passes, and the
profiler's kernel events are summed per op type and per kind (matmuls, activation quantization,
attention, layer norms, GELU, table lookups, the rest). The share of each profiled ``model_run`` spent
outside any kernel is the session's own overhead (feeding inputs, allocating outputs, handing work to
threads).

The profiler writes an event per kernel call, which slows every call: the times here are not latency
and never replace the timed rounds. Shares are what to read.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

KINDS = {
    "matmul": (
        "MatMul",
        "Gemm",
        "FusedMatMul",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "QGemm",
        "QLinearMatMul",
        "MatMulNBits",
    ),
    "act. quant": ("DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear"),
    "attention": ("Attention", "MultiHeadAttention", "QAttention", "Softmax"),
    "layer norm": (
        "LayerNormalization",
        "SkipLayerNormalization",
        "SimplifiedLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "EmbedLayerNormalization",
    ),
    "GELU": ("Gelu", "BiasGelu", "FastGelu", "QuickGelu", "Erf"),
    "lookup": ("Gather", "GatherBlockQuantized", "GatherElements"),
}
"""Op types by the kind of work they do; any other op type counts as "other"."""
KIND_OF = {op: kind for kind, ops in KINDS.items() for op in ops}
COLUMNS = [*KINDS, "other"]


def summarise(events: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Per-request kernel time by op type and kind from an ONNX Runtime profile (a list of trace events),
    leaving out the first ``warmup`` runs and anything before them (session creation)."""
    runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
        key=lambda e: e["ts"],
    )
    if len(runs) <= warmup:
        raise ValueError(f"the profile has {len(runs)} model runs, not more than the {warmup} warm-up runs")
    kept = runs[warmup:]
    start = kept[0]["ts"]
    by_op: dict[str, float] = defaultdict(float)
    nodes: dict[str, set[str]] = defaultdict(set)
    for event in events:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        if event["ts"] < start:
            continue
        op = event.get("args", {}).get("op_name", "?")
        by_op[op] += event["dur"]
        nodes[op].add(event["name"].removesuffix("_kernel_time"))
    requests = len(kept)
    run_us = sum(e["dur"] for e in kept) / requests
    kernel_us = sum(by_op.values()) / requests
    kinds = dict.fromkeys(COLUMNS, 0.0)
    for op, total in by_op.items():
        kinds[KIND_OF.get(op, "other")] += total / requests
    ops = [
        {
            "op": op,
            "kind": KIND_OF.get(op, "other"),
            "nodes": len(nodes[op]),
            "us": round(total / requests, 2),
        }
        for op, total in sorted(by_op.items(), key=lambda item: -item[1])
    ]
    return {
        "requests": requests,
        "run_us": round(run_us, 2),
        "kernel_us": round(kernel_us, 2),
        "outside_kernels": round(max(0.0, 1.0 - kernel_us / run_us), 4) if run_us else None,
        "kinds_us": {kind: round(us, 2) for kind, us in kinds.items()},
        "ops": ops,
    }


def profile(request: dict[str, Any]) -> dict[str, Any]:
    """Load the artifact as the runner does, profile ``warmup + samples`` batch-1 requests, summarise."""
    from compress.runtime.runner import OnnxSession, load

    runner = load(request["model"], threads=request["threads"])
    if runner.manifest.get("format") != "onnx":
        raise ValueError(f"{request['model']}: not an ONNX artifact")
    texts, pairs = request["texts"], request["pairs"]
    warmup, samples = request["warmup"], min(request["samples"], len(texts))
    with tempfile.TemporaryDirectory(prefix="compress-profile-") as tmp:
        runner.session = OnnxSession(runner.model, request["threads"], profile=str(Path(tmp) / "ort"))
        for i in range(warmup + samples):
            index = i % len(texts)
            runner.predict_logits([texts[index]], None if pairs is None else [pairs[index]])
        trace = Path(runner.session.end_profiling())
        events = json.loads(trace.read_text(encoding="utf-8"))
    return summarise(events, warmup)


def profile_rows(
    task_rows: list[dict[str, Any]], texts: list[str], pairs: list[str] | None, warmup: int, samples: int
) -> None:
    """Add ``op_profile`` to every ONNX artifact row, each profiled in a fresh process."""
    from compress.evaluate import worker_env

    for row in task_rows:
        entry = row["entry"]
        if entry.get("format") != "onnx":
            continue
        request = {
            "model": entry["path"],
            "threads": entry["measured"]["threads"],
            "texts": texts,
            "pairs": pairs,
            "warmup": warmup,
            "samples": samples,
        }
        with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
            path = Path(tmp) / "request.json"
            path.write_text(json.dumps(request), encoding="utf-8")
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.op_profile", str(path)],
                capture_output=True,
                text=True,
                env=worker_env(request["threads"]),
            )
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or ["no message"]
            raise RuntimeError(f"profiling {entry['path']} failed: {tail[0]}")
        row["op_profile"] = json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    """The worker: one JSON line on stdout; anything a library prints goes to stderr."""
    from benchmarks.rounds import reply_stream

    (request_path,) = argv
    replies = reply_stream()
    replies.write(json.dumps(profile(json.loads(Path(request_path).read_text(encoding="utf-8")))) + "\n")
    replies.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
