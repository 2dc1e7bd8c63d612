"""Drop the bytes an int8 ``.tflite`` carries beside its weights, and prove the model computes the same.

A LiteRT file stores each fixed-length signature as its own subgraph, and every subgraph lists its own
tensors. The weights' buffers are shared between subgraphs, but two things are written again per
tensor per subgraph: the tensor's name (litert-torch spells out the whole module path, ~500 bytes) and
its quantization parameters (a float scale and an int64 zero point per output channel; for a per-row
embedding table that is 12 bytes per vocabulary word). On a 3-signature shared student this was a
fifth of the int8 file. Flatbuffers may point several tables at one object, so equal quantization
parameters are written once and shared, and inner tensor names become short ids (names are needed
only while quantizing, where recipe scopes match them; signature inputs and outputs keep theirs).
The rewritten file must give bit-identical logits on every signature, or quantize fails with one
line and keeps nothing; a model without signatures has nothing to compare and is left as written.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from compress.errors import ExportError


class _Shared:
    """One quantization-parameters object packed once per flatbuffer builder, however many tensors use it."""

    def __init__(self, params: Any):
        self.params = params
        self._packed: tuple[Any, int] | None = None

    def Pack(self, builder: Any) -> int:
        if self._packed is None or self._packed[0] is not builder:
            self._packed = (builder, self.params.Pack(builder))
        return self._packed[1]


def _params_key(params: Any) -> str | None:
    if params is None or params.details is not None:
        return None  # custom or blockwise details: left as they are
    digest = hashlib.sha256()
    for field in ("min", "max", "scale", "zeroPoint"):
        value = getattr(params, field)
        digest.update(field.encode())
        if value is not None:
            digest.update(np.asarray(value).tobytes())
            digest.update(str(np.asarray(value).dtype).encode())
    digest.update(str(params.quantizedDimension).encode())
    return digest.hexdigest()


def _signature_tensors(model: Any) -> set[tuple[int, int]]:
    named = set()
    for signature in model.signatureDefs or []:
        for entry in [*(signature.inputs or []), *(signature.outputs or [])]:
            named.add((signature.subgraphIndex, entry.tensorIndex))
    return named


def compacted(model: Any) -> Any:
    """``model`` (a LiteRT ``ModelT``) with shared quantization parameters and short inner tensor names."""
    shared: dict[str, _Shared] = {}
    keep = _signature_tensors(model)
    for s, graph in enumerate(model.subgraphs):
        for i, tensor in enumerate(graph.tensors):
            if (s, i) not in keep:
                tensor.name = f"t{i}"
            key = _params_key(tensor.quantization)
            if key is not None:
                tensor.quantization = shared.setdefault(key, _Shared(tensor.quantization))
    return model


def _write(model: Any, path: Path) -> None:
    """Serialize with ai-edge-quantizer's own writer: buffers after the flatbuffer, 16-byte aligned."""
    from ai_edge_quantizer import model_modifier

    writer = getattr(model_modifier.ModelModifier, "_serialize_model", None)
    packed = getattr(model_modifier, "_PackedBufferData", None)
    if writer is None or packed is None:
        raise ExportError(
            f"{path.name}: this ai-edge-quantizer has no model writer compress knows; "
            "install the version in constraints.txt"
        )
    writer(model_modifier.ModelModifier(model), model, packed(model), str(path))


def _logits(path: Path, feeds: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    out = {}
    for key, inputs in feeds.items():
        result = interpreter.get_signature_runner(key)(**inputs)
        out[key] = np.asarray(result["logits"])
    return out


def _probe_feeds(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """One input per signature: token ids 1..n, every position attended (the values only need to be the
    same for both files; each id is below any vocabulary size a classifier has)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    feeds = {}
    for key in interpreter.get_signature_list():
        details = interpreter.get_signature_runner(key).get_input_details()
        inputs = {}
        for name, detail in details.items():
            shape, dtype = tuple(detail["shape"]), np.dtype(detail["dtype"])
            if name.endswith("input_ids"):
                inputs[name] = (np.arange(np.prod(shape)) % 97 + 1).reshape(shape).astype(dtype)
            elif name.endswith("attention_mask"):
                inputs[name] = np.ones(shape, dtype)
            else:
                inputs[name] = np.zeros(shape, dtype)
        feeds[key] = inputs
    return feeds


def compact_tflite(path: Path) -> dict[str, int]:
    """Rewrite the int8 model at ``path`` in place when that makes it smaller and computes the same.

    Returns the bytes before and after (equal when the file was kept as it was).
    """
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils

    before = path.stat().st_size
    kept = {"bytes_before": before, "bytes_after": before}
    candidate = path.with_name(f".{path.name}.compact")
    try:
        feeds = _probe_feeds(path)
        if not feeds:
            return kept
        _write(compacted(tfl_flatbuffer_utils.read_model(str(path))), candidate)
        after = candidate.stat().st_size
        if after >= before:
            return kept
        want, got = _logits(path, feeds), _logits(candidate, feeds)
        for key in want:
            if not np.array_equal(want[key], got[key]):
                raise ExportError(
                    f"{path.name}: the compacted model's logits differ from the original's on "
                    f"signature {key}; this is a compress bug, please report it"
                )
        candidate.replace(path)
        return {"bytes_before": before, "bytes_after": after}
    except ExportError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise ExportError(
            f"{path.name}: compacting the int8 model failed ({type(exc).__name__}: {first}); "
            "this is a compress bug, please report it"
        ) from None
    finally:
        candidate.unlink(missing_ok=True)
