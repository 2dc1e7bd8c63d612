"""ONNX int8 with ``onnxruntime.quantization``: dynamic (int8 weights) or static QDQ with calibration.

Static int8 on every op type collapses transformer accuracy (measured on all-MiniLM-L6-v2: 52%
agreement; onnxruntime issues 9599 and 11286): the activations after LayerNorm, Softmax and GELU have
ranges that one int8 scale cannot hold. Quantizing only MatMul/Gemm keeps the heavy compute in int8
and the fragile ops in float, so that is the static default here, plus Gather: the embedding tables
are stored int8, and a lookup's output keeps its table's scale, so it adds no error of its own
(without it the word table stays fp32 and the static file is 2.5x the size of the dynamic one).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np

from compress.errors import ExportError
from compress.export.onnx import SCOPES_KEY
from compress.io import atomic_dir
from compress.quantize import derive_artifact
from compress.quantize.constants import onnx_float_constants, require_int8_constants

STATIC_OP_TYPES = ["MatMul", "Gemm", "Gather"]
METHODS = ("minmax", "entropy", "percentile")


class FeedReader:
    """``CalibrationDataReader`` over prepared feeds (numpy arrays keyed by input name)."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._feeds = feeds
        self._iter: Iterator[dict[str, np.ndarray]] = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = iter(self._feeds)


def nodes_in_layers(model_path: Path, layers: list[str]) -> list[str]:
    """Names of the ONNX nodes traced from any of the given module names (``bert.encoder.layer.3...``)."""
    import onnx

    if not layers:
        return []
    model = onnx.load(str(model_path), load_external_data=False)
    wanted = {f"model.{layer}" for layer in layers} | set(layers)
    found = []
    for node in model.graph.node:
        scopes = next((p.value for p in node.metadata_props if p.key == SCOPES_KEY), None)
        if scopes and wanted & set(ast.literal_eval(scopes)):
            found.append(node.name)
    return found


def nodes_of_other_types(model_path: Path, op_types: list[str]) -> list[str]:
    """Names of the nodes a recipe's ``op_types`` leaves float on purpose (none when it sets no op_types)."""
    import onnx

    if not op_types:
        return []
    graph = onnx.load(str(model_path), load_external_data=False).graph
    return [node.name for node in graph.node if node.op_type not in op_types]


def store_tables_int8(source: Path, target: Path) -> None:
    """Write ``source`` to ``target`` with the float tables that Gather reads (the embeddings) stored int8.

    For graphs quantized elsewhere (the PT2E search winner quantizes only linear layers):
    onnxruntime's dynamic quantizer restricted to Gather, so every other node is left as it is.
    """
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    quiet = logging.getLogger()
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "check if the model is already quantized": it is, on purpose
    try:
        quantize_dynamic(source, target, op_types_to_quantize=["Gather"], weight_type=QuantType.QInt8)
    finally:
        quiet.setLevel(level)


def check_node_names(model_path: Path, names: list[str]) -> None:
    import onnx

    known = {n.name for n in onnx.load(str(model_path), load_external_data=False).graph.node}
    missing = [n for n in names if n not in known]
    if missing:
        raise ExportError(
            f"exclude_nodes: {missing[:3]} are not nodes of {model_path.name}; "
            f"node names look like {sorted(known)[:3]}"
        )


def quantize_onnx(
    float_dir: Path,
    out_dir: Path,
    *,
    scheme: Literal["dynamic", "static"],
    calibration: list[dict[str, np.ndarray]] | None = None,
    method: str = "minmax",
    op_types: list[str] | None = None,
    exclude_nodes: list[str] | None = None,
    float_layers: list[str] | None = None,
    per_channel: bool = True,
    activations: Literal["int8", "uint8"] = "int8",
    symmetric: bool = False,
    name: str | None = None,
) -> dict[str, Any]:
    """Quantize the fp32 ONNX artifact at ``float_dir`` into an int8 artifact folder at ``out_dir``.

    ``op_types`` default: every supported type for dynamic, ``MatMul``/``Gemm`` for static.
    ``float_layers`` are module names whose nodes stay float (added to ``exclude_nodes``).
    """
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    source = float_dir / "model.onnx"
    chosen_types = list(op_types or [])
    excluded = list(exclude_nodes or [])
    check_node_names(source, excluded)
    excluded += [n for n in nodes_in_layers(source, float_layers or []) if n not in excluded]
    if scheme == "static":
        op_types = op_types or STATIC_OP_TYPES
        if not calibration:
            raise ExportError("static int8 needs calibration samples; set calibration.samples > 0")
        if method not in METHODS:
            raise ExportError(f"calibration.method '{method}' is not one of {', '.join(METHODS)}")
    with atomic_dir(out_dir) as folder:
        target = folder / "model.onnx"
        try:
            if scheme == "dynamic":
                quantize_dynamic(
                    source,
                    target,
                    op_types_to_quantize=op_types,
                    per_channel=per_channel,
                    weight_type=QuantType.QInt8,
                    nodes_to_exclude=excluded,
                )
            else:
                quantize_static(
                    source,
                    target,
                    FeedReader(calibration),
                    quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=op_types,
                    per_channel=per_channel,
                    nodes_to_exclude=excluded,
                    activation_type=QuantType.QInt8 if activations == "int8" else QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    calibrate_method=getattr(
                        CalibrationMethod, {"minmax": "MinMax"}.get(method, method.title())
                    ),
                    extra_options={"ActivationSymmetric": symmetric},
                )
        except ExportError:
            raise
        except Exception as exc:
            raise ExportError(
                f"onnxruntime {scheme} quantization failed: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else ''}"
            ) from None
        artifact = name or Path(out_dir).name
        kept_float = onnx_float_constants(target)
        on_purpose = excluded + nodes_of_other_types(source, chosen_types)
        require_int8_constants(artifact, onnx_float_constants(target, on_purpose))
        quantization = {
            "tool": "onnxruntime.quantization",
            "scheme": scheme,
            "format": "QDQ" if scheme == "static" else "integer-ops",
            "granularity": "per-channel" if per_channel else "per-tensor",
            "weights": "int8",
            "activations": activations if scheme == "static" else "dynamic",
            "op_types": op_types or "all",
            "calibration": {
                "samples": sum(f["input_ids"].shape[0] for f in calibration or []),
                "method": method,
            }
            if scheme == "static"
            else None,
            "float_layers": list(float_layers or []),
            "excluded_nodes": excluded,
            "float_constant_bytes": sum(kept_float.values()),
        }
        manifest = derive_artifact(float_dir, folder, name=artifact, quantization=quantization)
    return manifest
