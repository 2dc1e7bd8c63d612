"""The export check: an artifact must compute what the PyTorch model computes, on real inputs.

A converter can succeed and still produce a wrong graph (a mis-lowered op, a shape specialised at
trace time). Comparing logits on real token ids at several batch sizes and lengths catches both;
a mismatch is an ``ExportError``, never a warning, because the artifact would ship wrong answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from compress.errors import ExportError

Feeds = dict[str, np.ndarray]

ATOL = 1e-3
RTOL = 1e-3


def torch_reference(module: Any) -> Callable[[Feeds], np.ndarray]:
    """Logits of the PyTorch wrapper (``compress.export.Classifier``) for numpy feeds."""
    import torch

    def run(feeds: Feeds) -> np.ndarray:
        with torch.no_grad():
            out = module(*(torch.from_numpy(np.asarray(feeds[name])) for name in module.names))
        return out["logits"].float().numpy()

    return run


def compare_outputs(
    reference: Callable[[Feeds], np.ndarray],
    candidate: Callable[[Feeds], np.ndarray],
    cases: list[Feeds],
    *,
    what: str,
    atol: float = ATOL,
    rtol: float = RTOL,
) -> dict[str, Any]:
    """Run both on every case; raise ``ExportError`` on a shape or value mismatch, else return the numbers."""
    if not cases:
        raise ExportError(f"{what}: no inputs to check the export with")
    worst, shapes = 0.0, []
    for feeds in cases:
        shape = list(next(iter(feeds.values())).shape)
        expected = reference(feeds)
        got = np.asarray(candidate(feeds), dtype=np.float32)
        if got.shape != expected.shape:
            raise ExportError(
                f"{what}: output shape {list(got.shape)} differs from PyTorch's "
                f"{list(expected.shape)} for inputs of shape {shape}"
            )
        if not np.isfinite(got).all():
            raise ExportError(f"{what}: non-finite logits for inputs of shape {shape}")
        diff = np.abs(got - expected)
        excess = float((diff - (atol + rtol * np.abs(expected))).max())
        worst = max(worst, float(diff.max()))
        if excess > 0:
            raise ExportError(
                f"{what}: logits differ from PyTorch by up to {float(diff.max()):.3g} "
                f"(tolerance {atol:g} + {rtol:g}*|logit|) for inputs of shape {shape}; "
                "the converted graph is wrong, do not ship it"
            )
        shapes.append(shape)
    return {"max_abs_diff": worst, "atol": atol, "rtol": rtol, "shapes": shapes}


def check_cases(
    texts: list[str],
    pairs: list[str] | None,
    encode: Callable[..., Feeds],
    lengths: list[int | None],
    batches: tuple[int, ...] = (1, 3),
) -> list[Feeds]:
    """Feeds at each batch size and length: short texts first, then the longest (truncated) ones.

    ``lengths`` holds fixed lengths (TFLite signatures) or ``None`` for "pad to the longest".
    """
    by_length = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    cases = []
    for length in lengths:
        for batch in batches:
            for chosen in (by_length[:batch], by_length[-batch:]):
                sub_pairs = [pairs[i] for i in chosen] if pairs is not None else None
                cases.append(encode([texts[i] for i in chosen], sub_pairs, length))
    return cases
