"""Numbers computed from logits and timings: task quality, fidelity to the teacher, latency percentiles.

Pure numpy, so the same functions score a PyTorch checkpoint, an ONNX file and a TFLite file; the
only thing that differs between them is how the logits were produced.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _f1(tp: int, fp: int, fn: int) -> float:
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def task_metrics(logits: np.ndarray, labels: list[int], label_names: list[str]) -> dict[str, Any]:
    """Accuracy, macro F1, per-class counts and, for two labels, F1 of the positive class (id 1).

    Per-class counts (support, predicted, correct) are kept because an accuracy that hides a model
    predicting one class for everything is the classic failure of an over-compressed student.
    """
    pred = np.asarray(logits).argmax(-1)
    gold = np.asarray(labels)
    per_class, f1s = {}, []
    for idx, name in enumerate(label_names):
        tp = int(((pred == idx) & (gold == idx)).sum())
        fp = int(((pred == idx) & (gold != idx)).sum())
        fn = int(((pred != idx) & (gold == idx)).sum())
        per_class[name] = {
            "support": int((gold == idx).sum()),
            "predicted": int((pred == idx).sum()),
            "correct": tp,
        }
        f1s.append(_f1(tp, fp, fn))
    # Macro F1 averages over classes that occur in the gold labels or the predictions: a class absent
    # from both (e.g. a single-class eval split) has no F1 to speak of.
    seen = [
        f
        for idx, f in enumerate(f1s)
        if per_class[label_names[idx]]["support"] or per_class[label_names[idx]]["predicted"]
    ]
    out: dict[str, Any] = {"accuracy": float((pred == gold).mean()), "macro_f1": float(np.mean(seen or f1s))}
    if len(label_names) == 2:
        out["f1"] = float(f1s[1])
    out["per_class"] = per_class
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def fidelity_metrics(logits: np.ndarray, teacher_logits: np.ndarray) -> dict[str, float]:
    """How closely a model follows the teacher: label agreement, mean KL(teacher || model), max |Δ logit|."""
    logits, teacher_logits = np.asarray(logits), np.asarray(teacher_logits)
    if logits.shape != teacher_logits.shape:
        raise ValueError(f"logits shape {logits.shape} differs from the teacher's {teacher_logits.shape}")
    log_p, log_q = _log_softmax(teacher_logits), _log_softmax(logits)
    kl = (np.exp(log_p) * (log_p - log_q)).sum(-1)
    return {
        "agreement": float((logits.argmax(-1) == teacher_logits.argmax(-1)).mean()),
        "mean_kl": float(kl.mean()),
        "max_abs_logit_diff": float(np.abs(logits.astype(np.float64) - teacher_logits).max()),
    }


def latency_summary(seconds: list[float]) -> dict[str, float]:
    """p50/p90/p99 and mean in milliseconds of per-request timings."""
    ms = np.asarray(seconds, dtype=np.float64) * 1000.0
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "mean": float(ms.mean()),
        "samples": len(ms),
    }


def latency_parts(parts: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """p50 and mean in milliseconds of each step of the requests (``{step: seconds per request}``).

    The means add up to the mean of the whole requests; medians of parts need not add up to the
    median of the whole, which is why both are kept."""
    out = {}
    for name, seconds in parts.items():
        ms = np.asarray(seconds, dtype=np.float64) * 1000.0
        out[name] = {"p50": float(np.percentile(ms, 50)), "mean": float(ms.mean())}
    return out


RESAMPLES = 2000
"""Default resamples of the bootstrap intervals: percentile bounds of a 95% interval settle to
about a tenth of a point at this count for dev sets of a few hundred to a few thousand rows."""


def predicted_ids(logits: np.ndarray) -> list[int]:
    """The label id each row is predicted as, kept per row so that paired statistics can be computed later."""
    return [int(i) for i in np.asarray(logits).argmax(-1)]


def _correct(ids: Any, gold: np.ndarray, what: str) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.shape[-1:] != gold.shape:
        raise ValueError(f"{what} has {ids.shape[-1] if ids.ndim else 0} rows, the gold labels {len(gold)}")
    return ids == gold


def _pooled_interval(
    correct: np.ndarray, reference: np.ndarray, resamples: int, seed: int, confidence: float
) -> dict[str, Any]:
    """Percentile interval of the seed-averaged accuracy minus (and over) the reference's.

    ``correct`` is (models, rows), ``reference`` (rows,). Each resample draws row indices once and
    applies them to every model and the reference: they were all scored on the same rows, so a row's
    difficulty moves them together, which is what makes the interval of the difference narrow and
    honest (resampling each separately would treat them as measured on unrelated data).
    """
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, not {confidence}")
    models, n = correct.shape
    if n == 0:
        raise ValueError("no rows to resample")
    rng = np.random.default_rng(seed)
    chunk = max(1, 2**22 // (n * (models + 1)))  # bounds memory at a few tens of MB for any row count
    mine, theirs = [], []
    for start in range(0, resamples, chunk):
        rows = rng.integers(0, n, size=(min(chunk, resamples - start), n))
        mine.append(correct[:, rows].mean(axis=(0, 2)))
        theirs.append(reference[rows].mean(axis=1))
    acc, ref = np.concatenate(mine), np.concatenate(theirs)
    tails = [50 * (1 - confidence), 50 * (1 + confidence)]
    point, point_ref = float(correct.mean()), float(reference.mean())
    low, high = np.percentile(100 * (acc - ref), tails)
    out: dict[str, Any] = {
        "method": "paired bootstrap over rows, percentile interval",
        "confidence": confidence,
        "resamples": resamples,
        "seed": seed,
        "rows": n,
        "diff_points": {"estimate": 100 * (point - point_ref), "low": float(low), "high": float(high)},
        "ratio": None,
    }
    if point_ref > 0 and (ref > 0).all():
        low, high = np.percentile(acc / ref, tails)
        out["ratio"] = {"estimate": point / point_ref, "low": float(low), "high": float(high)}
    return out


def paired_accuracy_interval(
    predictions: Any,
    reference: Any,
    gold: Any,
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """How much of the reference's accuracy a model keeps, with a paired bootstrap interval.

    ``diff_points`` is accuracy(model) − accuracy(reference) in percentage points and ``ratio`` is
    accuracy(model) / accuracy(reference) (None when the reference is right on no row of the data or
    of some resample); each has the point ``estimate`` and the percentile interval ``low``–``high``.
    Both models must have been run on the same rows, in the same order, as ``gold``.
    """
    gold = np.asarray(gold)
    mine = _correct(predictions, gold, "the predictions")
    return _pooled_interval(
        mine[None, :], _correct(reference, gold, "the reference's predictions"), resamples, seed, confidence
    )


def pooled_accuracy_interval(
    predictions: list[Any],
    reference: Any,
    gold: Any,
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """``paired_accuracy_interval`` of the accuracy averaged over several runs (seeds) on the same rows.

    Every resample draws one set of rows and scores every seed and the reference on it, then
    averages over the seeds: the interval is the row-sampling uncertainty of the seed-averaged
    accuracy kept. It does not resample seeds; their spread is reported on its own.
    """
    gold = np.asarray(gold)
    if not predictions:
        raise ValueError("no predictions to pool")
    mine = np.stack([_correct(p, gold, f"seed {i}'s predictions") for i, p in enumerate(predictions)])
    out = _pooled_interval(
        mine, _correct(reference, gold, "the reference's predictions"), resamples, seed, confidence
    )
    out["pooled"] = len(predictions)
    return out
