"""int8 artifacts derived from a checked fp32 artifact, and the numbers that say whether they are safe.

An int8 artifact folder is its float source's folder with the model file replaced: same tokenizer,
labels and input contract, plus the quantization settings (scheme, calibration, layers kept in
float). Agreement with the float source is measured through the on-device runner, the same code
that evaluates and ships the artifact.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from compress.errors import ExportError
from compress.export.artifact import MODEL_FILES
from compress.io import file_entries, read_json, write_json_atomic
from compress.run_layout import MANIFEST_FILE


def derive_artifact(
    float_dir: Path,
    folder: Path,
    *,
    name: str,
    quantization: dict[str, Any],
    check: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Finish an int8 folder whose model file is written: copy tokenizer/labels, write the manifest."""
    source = read_json(float_dir / MANIFEST_FILE)
    model_file = MODEL_FILES[source["format"]]
    if not (folder / model_file).is_file():
        raise ExportError(f"{folder}: {model_file} was not written")
    for extra in ("tokenizer.json", "labels.json"):
        shutil.copyfile(float_dir / extra, folder / extra)
    manifest = {
        **{k: v for k, v in source.items() if k != "files"},
        "name": name,
        "precision": "int8",
        "quantization": quantization,
        "float_source": {"name": source["name"], "sha256": _model_sha(float_dir, source)},
        "check": check or {},
    }
    manifest["files"] = file_entries(folder)
    write_json_atomic(folder / MANIFEST_FILE, manifest)
    return manifest


def _model_sha(folder: Path, manifest: dict[str, Any]) -> str:
    model_file = MODEL_FILES[manifest["format"]]
    return next(e["sha256"] for e in manifest["files"] if e["path"] == model_file)


def predict_logits(
    artifact_dir: Path, texts: list[str], pairs: list[str] | None, threads: int = 2
) -> np.ndarray:
    """Logits of an artifact folder through ``compress.runtime.runner`` (what evaluate and the board run),
    one request per row as a device serves them: in a padded batch, dynamic int8's per-tensor
    activation scale would let a row's batch-mates change its label."""
    from compress.runtime.runner import load

    runner = load(artifact_dir, threads=threads)
    return runner.predict_logits(texts, pairs, batch_size=1)


def agreement(float_logits: np.ndarray, int8_logits: np.ndarray, labels: list[int] | None) -> dict[str, Any]:
    """Share of predictions the int8 artifact keeps, plus both accuracies when labels exist."""
    ref, got = float_logits.argmax(-1), int8_logits.argmax(-1)
    out: dict[str, Any] = {"agreement": float((ref == got).mean()), "samples": len(ref)}
    if labels is not None:
        truth = np.asarray(labels)
        out["float_accuracy"] = float((ref == truth).mean())
        out["accuracy"] = float((got == truth).mean())
    return out


def relative_loss(measured: dict[str, Any], metric: str) -> float:
    """Loss relative to the float source: 1 - agreement, or the relative drop in accuracy."""
    if metric == "agreement":
        return 1.0 - measured["agreement"]
    base = measured["float_accuracy"]
    return (base - measured["accuracy"]) / base if base > 0 else 0.0
