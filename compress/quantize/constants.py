"""Which large constants an int8 artifact still stores in float, and the check that fails it for them.

A quantizer quietly skips what it does not recognise: onnxruntime leaves a weight float when a
``Transpose`` stands between it and its MatMul (a tied layer's weight, read by several layers, was
7 MB of a 10 MB "int8" file). So every int8 artifact is read back, and a float constant of at least
``LARGE`` bytes fails it, unless every op that reads it was kept float on purpose (``float_layers``,
``exclude_nodes``, op types outside a recipe's ``op_types``, the logits op).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from compress.errors import ExportError

LARGE = 64 * 1024
"""Bytes from which a float constant counts as a weight that int8 must cover (small ones are biases,
LayerNorm scales and shape constants)."""

_ONNX_FLOATS = {1: 4, 10: 2, 11: 8, 16: 2}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16: bytes per element
_TFLITE_FLOATS = {0: 4, 1: 2, 10: 8}  # FLOAT32, FLOAT16, FLOAT64
_BLOCK_QUANTIZED = {"GatherBlockQuantized": (2, 3)}
"""Block-quantized ops compress writes, and the input indices of their scales and zero points."""
_FOUR_BIT = {21, 22}  # onnx.TensorProto.UINT4, INT4


def _block_scales(graph: Any) -> set[str]:
    """Initializers that scale int4 blocks: the scales and zero points of ``GatherBlockQuantized``, and
    the scale a ``Mul`` applies to a 4-bit initializer's values (``Cast``, less its zero point: the
    folded lookup ``fold_block_lookups`` writes). They are part of the int4 storage, not weights."""
    four_bit = {i.name for i in graph.initializer if i.data_type in _FOUR_BIT}
    values: set[str] = set()
    found: set[str] = set()
    for node in graph.node:  # topological order: a Cast comes before the Sub and Mul that read it
        first = node.input[0] if node.input else ""
        derived = node.op_type == "Cast" and first in four_bit
        derived = derived or (node.op_type == "Sub" and first in values)
        if node.op_type in _BLOCK_QUANTIZED:
            found.update(node.input[i] for i in _BLOCK_QUANTIZED[node.op_type] if i < len(node.input))
        elif derived:
            values.add(node.output[0])
        elif node.op_type == "Mul" and set(node.input) & values:
            found.update(set(node.input) - values)
    return found


def weight_fingerprints(module: Any) -> set[str]:
    """Content hashes of ``module``'s large float weights, as stored and transposed.

    Lets a check recognise a float-on-purpose weight in a graph whose node names no longer say which
    layer they came from (the PT2E export, re-traced and constant-folded by onnxruntime).
    """
    found = set()
    for param in module.parameters():
        array = param.detach().float().cpu().numpy()
        if array.nbytes >= LARGE:
            found.add(_fingerprint(array))
            if array.ndim == 2:
                found.add(_fingerprint(array.T))
    return found


def _fingerprint(array: Any) -> str:
    import hashlib

    import numpy as np

    data = np.ascontiguousarray(array, dtype=np.float32)
    return f"{list(data.shape)}:{hashlib.sha256(data.tobytes()).hexdigest()}"


def onnx_float_constants(
    path: Path, float_nodes: Iterable[str] = (), float_weights: set[str] | None = None
) -> dict[str, int]:
    """Float initializers of ``LARGE`` bytes or more, by name, except those only float nodes read and
    those whose content is one of ``float_weights`` (see ``weight_fingerprints``)."""
    import math

    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path), load_external_data=False).graph
    kept = set(float_nodes)
    readers: dict[str, list[str]] = {}
    block_scales = _block_scales(graph)  # a block-quantized table's scales: part of its int4 storage
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.name)
    found = {}
    for init in graph.initializer:
        size = math.prod(init.dims) * _ONNX_FLOATS.get(init.data_type, 0)
        users = readers.get(init.name, [])
        if init.name in block_scales and len(users) == 1:
            continue
        if size >= LARGE and not (users and all(user in kept for user in users)):
            if float_weights and _fingerprint(numpy_helper.to_array(init)) in float_weights:
                continue
            found[init.name] = size
    return found


def tflite_float_constants(path: Path, float_scopes: Iterable[str] = ()) -> dict[str, int]:
    """Float constant tensors of ``LARGE`` bytes or more, by name, except those only float ops read.

    An op counts as float on purpose when one of its outputs matches a scope regex (the same
    matching ai-edge-quantizer applies to keep it float).
    """
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils

    model = tfl_flatbuffer_utils.read_model(str(path))
    scopes = [re.compile(s) for s in float_scopes]
    found = {}
    for graph in model.subgraphs:
        names = [t.name.decode() if isinstance(t.name, bytes) else str(t.name) for t in graph.tensors]
        readers: dict[int, list[bool]] = {}
        for op in graph.operators:
            on_purpose = any(s.search(names[o]) for o in op.outputs if o >= 0 for s in scopes)
            for index in op.inputs:
                if index >= 0:
                    readers.setdefault(index, []).append(on_purpose)
        for index, tensor in enumerate(graph.tensors):
            buffer = model.buffers[tensor.buffer]
            stored = len(buffer.data) if buffer.data is not None else int(buffer.size or 0)
            users = readers.get(index, [])
            if tensor.type in _TFLITE_FLOATS and stored >= LARGE and not (users and all(users)):
                found[names[index]] = max(found.get(names[index], 0), stored)
    return found


def require_int8_constants(artifact: str, found: dict[str, int]) -> None:
    """Fail an int8 artifact that still stores large float constants the recipe did not keep float."""
    if not found:
        return
    largest = max(found, key=found.get)
    short = largest.split("/")[-1][-80:]  # TFLite names carry the whole module path
    raise ExportError(
        f"{artifact}: {len(found)} constant(s) of >= {LARGE // 1024} KiB stayed float "
        f"({sum(found.values()):,} bytes; largest {short}, {found[largest]:,} bytes) in an int8 "
        "artifact; the quantizer did not cover them: keep their layers float on purpose "
        "(float_layers, exclude_nodes or op_types) or report it as a compress bug"
    )
