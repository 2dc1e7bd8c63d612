"""One benchmark row per measured model: the evaluation entry, flattened, plus its compute-bound floor.

Every row's numbers come from a ``compress.evaluate`` entry (or the torch_int8 worker's entry of
the same shape); this module only reads them, adds what the floor needs (multiply-adds at the mean
real length of the dev sentences, the measured GEMM peak for the row's precision) and decides the
headline comparison, with the paired bootstrap interval of each row's accuracy against the teacher's
PyTorch fp32 row (from the per-row predictions every entry keeps). Nothing here measures anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.hardware import encoder_macs, encoder_shape, floor_ms, padded_lengths, token_lengths
from compress.io import read_json
from compress.metrics import RESAMPLES, paired_accuracy_interval

RUNTIMES = {"torch": "PyTorch", "onnx": "ONNX Runtime", "tflite": "TFLite", "pt2": "PyTorch inductor"}
ACCURACY_SHARE = 0.97


def make_row(
    task: str,
    group: str,
    label: str,
    entry: dict[str, Any],
    checkpoint: Path,
    split: Any,
    peaks: dict[str, float],
    recipe: str | None = None,
    build: dict[str, Any] | None = None,
) -> dict:
    """Flatten an evaluation entry and add its floor.

    ``checkpoint`` is the Hugging Face folder the model was made from (its config.json gives the
    shape); the tokenizer is the row's own, so a pruned vocabulary is counted as it splits words.
    """
    metrics = entry["metrics"]
    folder = Path(entry["path"])
    tokenizer = folder / "tokenizer.json"
    lengths = token_lengths(tokenizer, split.texts, split.pairs, entry.get("max_length") or 128)
    shape = encoder_shape(read_json(checkpoint / "config.json"))
    macs = encoder_macs(shape, float(lengths.mean()))
    peak = peaks[entry["precision"]]
    padded_to = (metrics.get("latency_ms") or {}).get("padded_to")
    row = {
        "task": task,
        "group": group,
        "row": f"{label} · {RUNTIMES[entry['format']]} {entry['precision']}",
        "label": label,
        "recipe": recipe,
        "name": entry["name"],
        "format": entry["format"],
        "precision": entry["precision"],
        "runtime": entry["measured"]["runtime"],
        "accuracy": metrics.get("accuracy"),
        "f1": metrics.get("f1"),
        "agreement": metrics.get("agreement"),
        "p50_ms": metrics["latency_ms"]["p50"],
        "p90_ms": metrics["latency_ms"]["p90"],
        "throughput_per_s": metrics["throughput"]["items_per_s"],
        "bytes": entry["bytes"],
        "peak_rss_bytes": metrics["peak_rss_bytes"],
        "mean_tokens": float(lengths.mean()),
        "macs": macs,
        "floor_ms": floor_ms(macs["total"], peak),
        "padded_to": padded_to,
        "build": build,
        "entry": entry,
    }
    if padded_to:
        padded = float(padded_lengths(lengths, padded_to).mean())
        row["mean_padded_tokens"] = padded
        row["floor_padded_ms"] = floor_ms(encoder_macs(shape, padded)["total"], peak)
    row["x_floor"] = row["p50_ms"] / row["floor_ms"]
    return row


def refloor(row: dict[str, Any], was: dict[str, float], peaks: dict[str, float]) -> None:
    """Move a row's floors from the peaks it was made with (``was``) to ``peaks`` (a floor is its
    multiply-adds over the peak, so it scales by their ratio); its floor ratio follows its p50."""
    scale = was[row["precision"]] / peaks[row["precision"]]
    row["floor_ms"] *= scale
    if row.get("floor_padded_ms") is not None:
        row["floor_padded_ms"] *= scale
    row["x_floor"] = row["p50_ms"] / row["floor_ms"]


def is_reference(row: dict[str, Any]) -> bool:
    """The teacher's PyTorch fp32 row: what every interval of the accuracy kept is against."""
    return row["group"] == "teacher" and row["format"] == "torch"


def add_intervals(task_rows: list[dict[str, Any]], gold: list[int], resamples: int = RESAMPLES) -> None:
    """``accuracy_vs_teacher`` of every row of one task: the paired bootstrap interval of its accuracy
    minus (and over) the teacher PyTorch fp32 row's, on the same dev rows, or ``{"missing": why}``.

    A row that already says why it has none (its run's dev rows differ from the suite's) keeps that.
    """
    teacher = next((r for r in task_rows if is_reference(r)), None)
    reference = ((teacher or {}).get("entry") or {}).get("predictions")
    for row in task_rows:
        if row is teacher or "accuracy_vs_teacher" in row:
            continue
        mine = (row.get("entry") or {}).get("predictions")
        if teacher is None:
            why = "no teacher PyTorch fp32 row in this run (e.g. --only compress)"
        elif reference is None or mine is None:
            why = "no per-row predictions (measured before the suite kept them)"
        elif not len(mine) == len(reference) == len(gold):
            why = f"{len(mine)} predictions, {len(reference)} for the teacher, {len(gold)} dev rows"
        else:
            row["accuracy_vs_teacher"] = {
                "vs": teacher["row"],
                **paired_accuracy_interval(mine, reference, gold, resamples=resamples),
            }
            continue
        row["accuracy_vs_teacher"] = {"missing": why}


def is_headline(row: dict[str, Any], recipe: str, fmt: str) -> bool:
    """The headline is the last (most compressed) artifact of ``recipe`` in ``fmt``: its int8 row."""
    return (
        row["group"] == "compress"
        and row["recipe"] == recipe
        and row["format"] == fmt
        and (row["precision"] == "int8")
    )


def headline_verdict(rows: list[dict[str, Any]], recipe: str, fmt: str) -> dict[str, Any]:
    """Is the headline artifact strictly ahead of every peer row (faster at equal-or-better accuracy)
    while keeping >= 97% of the teacher's accuracy? Peers are the int8 one-liners; the teacher's
    float rows are the reference and are compared too, for information only."""
    headline = next((r for r in rows if is_headline(r, recipe, fmt)), None)
    teacher = next(r for r in rows if is_reference(r))
    if headline is None:
        return {"headline": None, "ahead_of_all": False, "detail": f"no int8 {fmt} row from recipe {recipe}"}
    keeps = headline["accuracy"] >= ACCURACY_SHARE * teacher["accuracy"]
    against = [
        {
            "row": other["row"],
            "peer": other["group"] == "peer",
            "faster": headline["p50_ms"] < other["p50_ms"],
            "as_accurate": headline["accuracy"] >= other["accuracy"],
            "p50_ratio": headline["p50_ms"] / other["p50_ms"],
            "accuracy_delta": headline["accuracy"] - other["accuracy"],
        }
        for other in rows
        if other["group"] in ("teacher", "peer")
    ]
    beaten = [a["faster"] and a["as_accurate"] for a in against if a["peer"]]
    return {
        "headline": headline["row"],
        "accuracy": headline["accuracy"],
        "teacher_accuracy": teacher["accuracy"],
        "accuracy_share": headline["accuracy"] / teacher["accuracy"],
        "accuracy_share_interval": (headline.get("accuracy_vs_teacher") or {}).get("ratio"),
        "keeps_97pct": keeps,
        "against": against,
        "ahead_of_all": keeps and bool(beaten) and all(beaten),
    }


ISSUE_TARGETS = {
    "accuracy_share": {"sst2": 0.99, "mrpc": 0.98},
    "bytes_ratio": 0.25,
    "p50_ratio": 1 / 3,
    "x_floor": {"onnx": 2.5, "tflite": 3.0},
}
"""Issue 16 (accuracy kept per task; bytes and p50 against the teacher's int8 file in the same format)
and issue 19 (p50 over the row's compute floor; TFLite against its padded floor)."""
INT8_BASELINE = {"onnx": "teacher-onnx-int8-ort", "tflite": "teacher-tflite-int8-aeq"}
"""The teacher's int8 row each format's headline is held against: ORT dynamic int8, ai-edge-quantizer."""


def issue_targets(task_rows: list[dict[str, Any]], task: str, recipe: str) -> list[dict[str, Any]]:
    """Per format, the recipe's int8 artifact against the issues' targets, from one run's rows: the
    share of the teacher's accuracy, bytes and p50 over the teacher's int8 row of the same format,
    and p50 over the compute floor (the padded floor for fixed-shape models, which compute on whole
    signatures). A format without its artifact or its baseline row is left out;
    ``accuracy_target`` is None for a task the issues set no target for."""
    teacher = next((r for r in task_rows if is_reference(r)), None)
    out = []
    for fmt, baseline in INT8_BASELINE.items():
        head = next((r for r in task_rows if is_headline(r, recipe, fmt)), None)
        base = next((r for r in task_rows if r.get("name") == baseline), None)
        if head is None or base is None or teacher is None:
            continue
        out.append(
            {
                "format": fmt,
                "row": head["row"],
                "baseline": base["row"],
                "accuracy_share": head["accuracy"] / teacher["accuracy"],
                "accuracy_target": ISSUE_TARGETS["accuracy_share"].get(task),
                "bytes_ratio": head["bytes"] / base["bytes"],
                "p50_ratio": head["p50_ms"] / base["p50_ms"],
                "x_floor": head["p50_ms"] / head.get("floor_padded_ms", head["floor_ms"]),
                "x_floor_target": ISSUE_TARGETS["x_floor"][fmt],
            }
        )
    return out


def positive_int(text: str) -> int:
    """argparse type: a whole number > 0."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number > 0")
    return value
