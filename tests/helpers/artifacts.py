"""Tiny ONNX and TFLite artifacts (the export folder contract) from a tiny checkpoint, for runtime tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from compress.io import file_entries, write_json_atomic

NAMES = ["input_ids", "attention_mask", "token_type_ids"]
_BUILT: dict[tuple[str, str, tuple[int, ...]], Path] = {}


def _wrapper(checkpoint: Path):
    """Logits from the three named inputs; a 4-D additive mask keeps GATHER_ND out (tflite-runtime 2.14)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(checkpoint)).eval()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            mask = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min
            return self.model(input_ids=input_ids, attention_mask=mask, token_type_ids=token_type_ids).logits

    return Logits().eval()


def _export(wrapper, folder: Path, fmt: str, lengths: list[int]) -> None:
    import torch

    if fmt == "onnx":
        sample = tuple(torch.ones(1, lengths[0], dtype=torch.long) for _ in NAMES)
        axes = {name: {0: "batch", 1: "sequence"} for name in NAMES}
        torch.onnx.export(
            wrapper, sample, str(folder / "model.onnx"), input_names=NAMES, output_names=["logits"],
            dynamic_axes=axes, opset_version=17, dynamo=False,
        )  # fmt: skip
        return
    import litert_torch

    converter = None
    for length in lengths:
        sample = {name: torch.ones(1, length, dtype=torch.int32) for name in NAMES}
        add = litert_torch.signature if converter is None else converter.signature
        converter = add(f"seq_{length}", wrapper, sample_kwargs=sample)
    converter.convert().export(str(folder / "model.tflite"))


def make_artifact(
    checkpoint: Path, folder: Path, fmt: str, lengths: list[int], *, target: str = "tiny-board"
) -> Path:
    """An artifact folder: model file, tokenizer.json, labels.json and a manifest with sha256 of each file."""
    from transformers import AutoConfig

    folder.mkdir(parents=True, exist_ok=True)
    _export(_wrapper(checkpoint), folder, fmt, lengths)
    shutil.copy(checkpoint / "tokenizer.json", folder / "tokenizer.json")
    id2label = AutoConfig.from_pretrained(str(checkpoint)).id2label
    (folder / "labels.json").write_text(json.dumps([id2label[i] for i in sorted(id2label)]))
    dtype = "int64" if fmt == "onnx" else "int32"
    manifest = {
        "kind": "artifact",
        "name": f"02-export/{folder.name}",
        "format": fmt,
        "target": target,
        "precision": "fp32",
        "quantization": None,
        "inputs": [{"name": n, "dtype": dtype, "shape": [1, max(lengths)]} for n in NAMES],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": [1, len(id2label)]}],
        "max_length": max(lengths),
        "sequence_lengths": lengths,
        "task": {"text_pair": False},
        "source": {"checkpoint": str(checkpoint)},
        "check": {},
        "files": file_entries(folder),
    }
    write_json_atomic(folder / "manifest.json", manifest)
    return folder


def cached_artifact(checkpoint: Path, scratch: Path, fmt: str, lengths: list[int]) -> Path:
    """Build once per test session (a TFLite conversion takes seconds); callers copy before modifying."""
    key = (str(checkpoint), fmt, tuple(lengths))
    if key not in _BUILT:
        _BUILT[key] = make_artifact(
            checkpoint, scratch / f"{fmt}-{'-'.join(map(str, lengths))}", fmt, lengths
        )
    return _BUILT[key]
