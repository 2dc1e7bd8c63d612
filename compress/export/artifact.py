"""The artifact folder contract: model file, tokenizer.json, labels.json and a manifest that describes them.

evaluate, bundle and the on-device runner read only this folder, so everything an app developer
needs to call the model (input names, dtypes, shapes, max_length, label order) is written here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compress.errors import ExportError
from compress.io import file_entries, write_json_atomic
from compress.models import label_names_of
from compress.run_layout import MANIFEST_FILE

MODEL_FILES = {"onnx": "model.onnx", "tflite": "model.tflite"}

ARTIFACT_SCHEMA = "compress.artifact/1"
"""Version of an artifact folder's manifest.json; keys added later keep it, a change of meaning bumps it."""


def write_tokenizer(tokenizer: Any, folder: Path) -> None:
    """Save the fast tokenizer as one ``tokenizer.json`` (the runner needs only the tokenizers package)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ExportError(
            f"{type(tokenizer).__name__} is not a fast tokenizer; artifacts need tokenizer.json "
            "(load the checkpoint with a tokenizer that has a fast version)"
        )
    backend.save(str(folder / "tokenizer.json"))


def source_info(checkpoint: Path | None) -> dict[str, Any] | None:
    if checkpoint is None:
        return None
    from compress.models import folder_weights_sha

    return {"checkpoint": str(checkpoint), "sha": folder_weights_sha(Path(checkpoint))}


def finish_artifact(
    folder: Path,
    *,
    model: Any,
    tokenizer: Any,
    name: str,
    fmt: str,
    target: str,
    threads: int,
    precision: str,
    quantization: dict[str, Any] | None,
    inputs: list[dict[str, Any]],
    num_labels: int,
    batch: int | str,
    max_length: int,
    sequence_lengths: list[int],
    text_pair: bool,
    source: dict[str, Any] | None,
    check: dict[str, Any],
    runtime: dict[str, Any] | None = None,
    fusion: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write tokenizer.json, labels.json and manifest.json beside the model file; return the manifest.

    ``runtime`` (TFLite) is the runtime contract: the ops and op versions the model file needs and the
    interpreters that loaded it at export. ``fusion`` (ONNX) says whether the graph is ONNX Runtime's
    fused one, the fused op counts, and why not when fusion was asked for and not applied."""
    if not (folder / MODEL_FILES[fmt]).is_file():
        raise ExportError(f"{folder}: {MODEL_FILES[fmt]} was not written")
    write_tokenizer(tokenizer, folder)
    write_json_atomic(folder / "labels.json", label_names_of(model))
    manifest = {
        "schema": ARTIFACT_SCHEMA,
        "kind": "artifact",
        "name": name,
        "format": fmt,
        "target": target,
        "threads": threads,
        "precision": precision,
        "quantization": quantization,
        "inputs": inputs,
        "outputs": [{"name": "logits", "dtype": "float32", "shape": [batch, num_labels]}],
        "max_length": max_length,
        "sequence_lengths": sequence_lengths,
        "task": {"text_pair": text_pair},
        "source": source,
        "check": check,
        **({"runtime": runtime} if runtime is not None else {}),
        **({"fusion": fusion} if fusion is not None else {}),
        "files": file_entries(folder),
    }
    write_json_atomic(folder / MANIFEST_FILE, manifest)
    return manifest
