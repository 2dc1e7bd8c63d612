"""What a model costs to ship: bytes, content hash and parameter count, read from its files.

Parameters are counted from the artifact itself rather than copied from the checkpoint it came
from, so a weight that an exporter duplicated (or a shared layer it kept shared) shows up as what
the device actually loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compress.io import sha256_file, sha256_json
from compress.run_layout import CARD_FILE

_ONNX_WEIGHT_TYPES = {1, 2, 3, 10, 16}  # float, uint8, int8, float16, bfloat16
_TFLITE_WEIGHT_TYPES = {0, 1, 3, 9, 17, 18}  # float32, float16, uint8, int8, int4, bfloat16
_QUANT_SUFFIXES = ("_scale", "_zero_point", "scale", "zero_point")


def weight_files(folder: Path) -> list[Path]:
    """The files that hold a checkpoint's weights (safetensors shards, or pickle if that is all there is)."""
    return sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))


def model_file(folder: Path, fmt: str) -> Path | None:
    return {"onnx": folder / "model.onnx", "tflite": folder / "model.tflite"}.get(fmt)


def model_bytes_and_sha(folder: Path, fmt: str) -> tuple[int, str]:
    """Bytes of the weights a runtime loads, and their sha256 (a hash of hashes for sharded files)."""
    files = [model_file(folder, fmt)] if fmt in ("onnx", "tflite") else weight_files(folder)
    files = [f for f in files if f is not None and f.is_file()]
    onnx_data = sorted(folder.glob("*.onnx.data")) + sorted(folder.glob("*.onnx_data"))
    if fmt == "onnx":
        files += onnx_data
    size = sum(f.stat().st_size for f in files)
    shas = [sha256_file(f) for f in files]
    return size, shas[0] if len(shas) == 1 else sha256_json(shas)


def total_bytes(folder: Path) -> int:
    """Every file in the folder: what a deploy bundle carries (model, tokenizer, labels, manifest).

    Not the model card (``README.md`` at the top), which ``compress report`` writes into the folder
    after measuring it: a folder measured again later must weigh the same."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p != folder / CARD_FILE)


def _numel(dims: Any) -> int:
    total = 1
    for d in dims:
        total *= int(d)
    return total


def onnx_parameters(path: Path) -> int:
    """Elements of weight initializers, without quantization scales/zero points or int shape constants."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    total = 0
    for init in model.graph.initializer:
        numel = _numel(init.dims)
        if init.data_type in _ONNX_WEIGHT_TYPES and numel > 1 and not init.name.endswith(_QUANT_SUFFIXES):
            total += numel
    return total


def tflite_parameters(path: Path) -> int:
    """Elements of constant weight tensors, each buffer counted once (shared layers stay shared)."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(path.read_bytes(), 0)
    seen: set[int] = set()
    total = 0
    for s in range(model.SubgraphsLength()):
        graph = model.Subgraphs(s)
        for t in range(graph.TensorsLength()):
            tensor = graph.Tensors(t)
            index = tensor.Buffer()
            if index == 0 or index in seen or tensor.Type() not in _TFLITE_WEIGHT_TYPES:
                continue
            buffer = model.Buffers(index)
            if buffer.DataLength() == 0 and buffer.Offset() <= 1:
                continue
            numel = _numel(tensor.ShapeAsNumpy()) if tensor.ShapeLength() else 1
            if numel > 1:
                seen.add(index)
                total += numel
    return total


def artifact_parameters(folder: Path, fmt: str) -> int:
    path = model_file(folder, fmt)
    return onnx_parameters(path) if fmt == "onnx" else tflite_parameters(path)
