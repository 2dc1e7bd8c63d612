"""How fast this CPU can multiply matrices, and how many multiply-adds a model needs per sentence.

Together they give each benchmark row a compute-bound floor: the latency it would have if every
multiply-add ran at the best GEMM rate this machine reaches for its precision. A row far above its
floor is paying for something other than arithmetic (memory traffic, dispatch, padding, tokenizing).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def _best_seconds(fn: Callable[[], Any], repeats: int, budget_s: float) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up, stopping early once ``budget_s`` is spent."""
    fn()
    best, spent = float("inf"), 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
        if spent > budget_s:
            break
    return best


def _torch_rates(n: int, threads: int, repeats: int, budget_s: float) -> dict[str, float]:
    import torch

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    qa = torch.randint(-128, 128, (n, n), dtype=torch.int8, generator=gen)
    qb = torch.randint(-128, 128, (n, n), dtype=torch.int8, generator=gen)
    macs = float(n) ** 3
    with torch.inference_mode():
        return {
            "fp32 torch.matmul": macs / _best_seconds(lambda: torch.matmul(a, b), repeats, budget_s),
            "int8 torch._int_mm": macs / _best_seconds(lambda: torch._int_mm(qa, qb), repeats, budget_s),
        }


def _ort_matmul(n: int, threads: int, integer: bool) -> Callable[[], Any]:
    """An onnxruntime session multiplying an n×n input by an n×n constant (MatMulInteger or MatMul)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if integer:
        weight = rng.integers(-128, 128, (n, n), dtype=np.int8)
        node = helper.make_node("MatMulInteger", ["a", "w"], ["y"])
        a_type, y_type, feed = TensorProto.UINT8, TensorProto.INT32, rng.integers(0, 256, (n, n), np.uint8)
    else:
        weight = rng.standard_normal((n, n), dtype=np.float32)
        node = helper.make_node("MatMul", ["a", "w"], ["y"])
        a_type, y_type, feed = TensorProto.FLOAT, TensorProto.FLOAT, rng.standard_normal((n, n), np.float32)
    graph = helper.make_graph(
        [node],
        "gemm",
        [helper.make_tensor_value_info("a", a_type, [n, n])],
        [helper.make_tensor_value_info("y", y_type, [n, n])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"a": feed})


def _ort_rates(n: int, threads: int, repeats: int, budget_s: float) -> dict[str, float]:
    macs = float(n) ** 3
    return {
        "fp32 onnxruntime MatMul": macs / _best_seconds(_ort_matmul(n, threads, False), repeats, budget_s),
        "int8 onnxruntime MatMulInteger": macs
        / _best_seconds(_ort_matmul(n, threads, True), repeats, budget_s),
    }


def gemm_peaks(threads: int = 2, n: int = 2048, repeats: int = 10, budget_s: float = 3.0) -> dict[str, Any]:
    """Multiply-adds per second of large square GEMMs in fp32 and int8, through torch and onnxruntime.

    The peak per precision is the best library's rate: the floor should be what this CPU can do,
    not what one library happens to reach.
    """
    rates = {**_torch_rates(n, threads, repeats, budget_s), **_ort_rates(n, threads, repeats, budget_s)}
    peak = {
        precision: max(v for k, v in rates.items() if k.startswith(precision))
        for precision in ("fp32", "int8")
    }
    return {"size": n, "threads": threads, "macs_per_s": rates, "peak_macs_per_s": peak}


@dataclass(frozen=True)
class EncoderShape:
    """What the multiply-add count of a BERT-like classifier depends on."""

    layers: int
    hidden: int
    intermediate: int
    num_labels: int
    embedding_rank: int | None = None


def encoder_shape(config: dict[str, Any]) -> EncoderShape:
    """Read a Hugging Face BERT-style config.json (with compress_sharing for a factorised embedding)."""
    sharing = config.get("compress_sharing") or {}
    labels = config.get("id2label") or {}
    return EncoderShape(
        layers=int(config["num_hidden_layers"]),
        hidden=int(config["hidden_size"]),
        intermediate=int(config["intermediate_size"]),
        num_labels=len(labels) or int(config.get("num_labels", 2)),
        embedding_rank=sharing.get("embedding_rank"),
    )


def encoder_macs(shape: EncoderShape, length: float) -> dict[str, float]:
    """Multiply-adds of one forward pass over ``length`` tokens.

    Per layer: Q, K, V and output projections (4·s·H²), the feed-forward pair (2·s·H·I) and the
    attention products QKᵀ and AV (2·s²·H); plus the E×H projection of a factorised embedding,
    the pooler on the first token (H²) and the classifier (H·C). Lookups, softmax, GELU and
    layer norms are not multiply-adds and are left out, so the floor stays a lower bound.
    """
    s, h = float(length), shape.hidden
    linear = shape.layers * s * (4 * h * h + 2 * h * shape.intermediate)
    linear += (s * shape.embedding_rank * h if shape.embedding_rank else 0.0) + h * h + h * shape.num_labels
    attention = shape.layers * 2 * s * s * h
    return {"linear": linear, "attention": attention, "total": linear + attention}


def token_lengths(
    tokenizer_json: Path, texts: list[str], pairs: list[str] | None, max_length: int
) -> np.ndarray:
    """Real (unpadded) token count of each row with this model's own tokenizer and truncation."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    inputs = list(zip(texts, pairs, strict=True)) if pairs is not None else texts
    return np.array([len(e.ids) for e in tokenizer.encode_batch(inputs)])


def padded_lengths(lengths: np.ndarray, signatures: list[int]) -> np.ndarray:
    """The length a fixed-shape model computes on: the smallest signature that fits each row."""
    ladder = sorted(signatures)
    return np.array([next((s for s in ladder if s >= n), ladder[-1]) for n in lengths])


def floor_ms(macs: float, peak_macs_per_s: float) -> float:
    return 1000.0 * macs / peak_macs_per_s


def best_of(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """One GEMM measurement from several passes of ``gemm_peaks`` at the same size and threads: each
    library's best rate. A peak is what the CPU can do, and a shared machine only ever slows a pass
    down (seen here: one library's int8 rate 383 and 901 GMAC/s in two runs an hour apart), so the
    fastest pass is the estimate; every pass stays in ``passes``."""
    if not passes:
        raise ValueError("no GEMM passes")
    if len({(p["size"], p["threads"]) for p in passes}) != 1:
        raise ValueError("GEMM passes differ in size or threads")
    rates = {name: max(p["macs_per_s"][name] for p in passes) for name in passes[0]["macs_per_s"]}
    peak = {
        precision: max(v for k, v in rates.items() if k.startswith(precision))
        for precision in passes[0]["peak_macs_per_s"]
    }
    return {
        "size": passes[0]["size"],
        "threads": passes[0]["threads"],
        "macs_per_s": rates,
        "peak_macs_per_s": peak,
        "passes": [{k: p[k] for k in ("macs_per_s", "peak_macs_per_s")} for p in passes],
    }
