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
