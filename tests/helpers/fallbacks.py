"""An artifact folder with a fallback model beside model.tflite, as the quantize stage writes for a Pi."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from compress.io import file_entries, read_json, write_json_atomic

FALLBACK = "fallback-weight-only.tflite"


def with_fallback(artifact: Path, into: Path, model_file: str = "model.tflite", **entry: Any) -> Path:
    """A copy of a TFLite ``artifact`` whose manifest sends tflite_runtime < 2.15 to a second model file
    (a copy of ``model_file``'s bytes: the choice shows in which file the runner opens)."""
    folder = Path(shutil.copytree(artifact, into))
    shutil.copyfile(folder / model_file, folder / FALLBACK)
    manifest = read_json(folder / "manifest.json")
    manifest["fallbacks"] = [
        {
            "path": FALLBACK,
            "interpreter": "tflite_runtime",
            "below": "2.15",
            "scheme": "weight-only",
            "reason": "tflite-runtime 2.14 computes dynamic int8 wrongly",
            **entry,
        }
    ]
    manifest["files"] = file_entries(folder)
    write_json_atomic(folder / "manifest.json", manifest)
    return folder
