"""ONNX int8 with ``onnxruntime.quantization``: dynamic (int8 weights) or static QDQ with calibration.

Static int8 on every op type collapses transformer accuracy (measured on all-MiniLM-L6-v2: 52%
agreement; onnxruntime issues 9599 and 11286): the activations after LayerNorm, Softmax and GELU have
ranges that one int8 scale cannot hold. Quantizing only MatMul/Gemm keeps the heavy compute in int8
and the fragile ops in float, so that is the static default here, plus Gather: the embedding tables
are stored int8, and a lookup's output keeps its table's scale, so it adds no error of its own
(without it the word table stays fp32 and the static file is 2.5x the size of the dynamic one).

``embedding_bits=4`` stores those tables in int4 instead, in blocks along the hidden axis with their
own scale and zero point (onnxruntime's ``MatMulNBitsQuantizer`` writes ``GatherBlockQuantized``):
a lookup table is read one row per token, so its bytes are all storage and no compute, and after
vocabulary pruning the word table is the largest constant a shared student keeps. How the graph reads
those int4 bytes is ``embedding_lookup``: ``fold`` (the default) rewrites each ``GatherBlockQuantized``
as constant arithmetic on the int4 initializers (``Cast``, ``Sub``, ``Mul``, ``Reshape``) feeding a plain
``Gather``; ONNX Runtime's constant folding (on at its default optimization level) turns that into a
float table when it loads the file, so every call is a plain lookup while the file keeps the int4
bytes. ``blocked`` keeps ``GatherBlockQuantized``, which dequantizes its rows on every call (least
memory, about a tenth more time per batch-1 call on the 3-layer headline; ``benchmarks/lookup_variants.py``).
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
FLOAT = 1  # onnx.TensorProto.FLOAT: the type of a fused contrib op's output shape inference cannot name
METHODS = ("minmax", "entropy", "percentile")
EMBEDDING_BITS = (8, 4)
LOOKUPS = ("fold", "blocked")


class FeedReader:
    """``CalibrationDataReader`` over prepared feeds (numpy arrays keyed by input name)."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._feeds = feeds
        self._iter: Iterator[dict[str, np.ndarray]] = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = iter(self._feeds)


def torchscript_scope(layer: str) -> str:
    """The node-name prefix the TorchScript exporter gives a module's ops: ``bert.encoder.layer.3.output``
    -> ``/bert/encoder/layer.3/output/`` (a ``ModuleList`` index stays joined to its list's name)."""
    parts: list[str] = []
    for part in layer.split("."):
        if part.isdigit() and parts:
            parts[-1] += f".{part}"
        else:
            parts.append(part)
    return "/" + "/".join(parts) + "/"


def nodes_in_layers(model_path: Path, layers: list[str]) -> list[str]:
    """Names of the ONNX nodes traced from any of the given module names (``bert.encoder.layer.3...``).

    A dynamo export says so in each node's scope metadata; a fused (TorchScript) export in its node
    names. A layer none of whose nodes is left (fused into an op that also computes other layers'
    work) is an error: keeping it float silently would not happen.
    """
    import onnx

    if not layers:
        return []
    model = onnx.load(str(model_path), load_external_data=False)
    prefixes = {layer: (torchscript_scope(f"model.{layer}"), torchscript_scope(layer)) for layer in layers}
    found, matched = [], set()
    for node in model.graph.node:
        scopes = next((p.value for p in node.metadata_props if p.key == SCOPES_KEY), None)
        traced = set(ast.literal_eval(scopes)) if scopes else set()
        hits = {
            layer
            for layer in layers
            if {layer, f"model.{layer}"} & traced or node.name.startswith(prefixes[layer])
        }
        if hits:
            found.append(node.name)
            matched |= hits
    missing = [layer for layer in layers if layer not in matched]
    if missing and is_fused(model):
        raise ExportError(
            f"float_layers: no node of {model_path.name} computes only {missing[0]!r} (ONNX Runtime's "
            "fusions merged it into a fused op); keep a whole layer float, export with attention: separate "
            "(a query/key/value projection) or with fuse: false"
        )
    return found


def is_fused(model: Any) -> bool:
    """Whether the graph holds ONNX Runtime's transformer contrib ops (the export's ``fuse``)."""
    return any(node.domain == "com.microsoft" for node in model.graph.node)


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


def store_tables_int4(
    path: Path, block_size: int, lookup: Literal["fold", "blocked"], exclude_nodes: list[str] | None = None
) -> dict[str, Any]:
    """Rewrite ``path`` in place with every float table a ``Gather`` reads stored as int4 blocks
    (except the lookups in ``exclude_nodes``, kept float on purpose).

    Asymmetric blocks of ``block_size`` values along the hidden axis (axis 1 of a [vocab, hidden]
    table), each with a float scale and an int4 zero point, in opset 21 (int4 tensors); onnxruntime's
    ``GatherBlockQuantized`` contrib op reads them (``lookup="blocked"``), or, with ``lookup="fold"``,
    constant ops that ONNX Runtime folds into float tables at load (``fold_block_lookups``). Returns
    what was stored.
    """
    import logging

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    model = onnx.load(str(path))
    floats = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    excluded = set(exclude_nodes or [])
    lookups = {
        n.input[0]
        for n in model.graph.node
        if n.op_type == "Gather" and n.input[0] in floats and n.name not in excluded
    }
    config = DefaultWeightOnlyQuantConfig(
        block_size=block_size,
        is_symmetric=False,
        op_types_to_quantize=("Gather",),
        quant_axes=(("Gather", 1),),
        bits=4,
    )
    quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # a line per skipped node, and the forced opset-21 upgrade it needs
    try:
        # an all-zero block (the padding row) has scale 0, which the quantizer maps to its zero point
        with np.errstate(divide="ignore", invalid="ignore"):
            quantizer = MatMulNBitsQuantizer(model, nodes_to_exclude=sorted(excluded), algo_config=config)
            quantizer.process()
    finally:
        quiet.setLevel(level)
    result = quantizer.model.model
    still_read = {n.input[0] for n in result.graph.node if n.op_type == "Gather"}
    tables = sorted(lookups - still_read)
    if not tables:
        raise ExportError(
            f"{path.name}: embedding_bits: 4 found no float embedding table to store int4 "
            "(no Gather reads a float initializer); use embedding_bits: 8"
        )
    if lookup == "fold":
        fold_block_lookups(result)
    onnx.save(result, str(path))
    return {
        "bits": 4,
        "block_size": block_size,
        "symmetric": False,
        "op": "Gather of int4 blocks folded to float at load"
        if lookup == "fold"
        else "com.microsoft.GatherBlockQuantized",
        "lookup": lookup,
        "tables": tables,
    }


def fold_block_lookups(model: Any) -> list[str]:
    """Rewrite ``model`` (an ``onnx.ModelProto``) in place with every ``GatherBlockQuantized`` as a
    plain ``Gather`` of a table computed from the same int4 initializers by constant ops:
    ``(Cast(q) - Cast(zero point)) * scale``, per block, reshaped to [vocab, hidden]. The arithmetic is
    the op's own, so the logits are the same; ONNX Runtime folds it into a float table at load. Returns
    the tables rewritten.
    """
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    nodes, folded = [], []
    for node in graph.node:
        if node.op_type != "GatherBlockQuantized":
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        table, indices, scales, *zero_point = node.input
        rows, width = inits[table].dims
        block = attrs.get("block_size", 128)
        if attrs.get("gather_axis", 0) != 0 or attrs.get("quantize_axis", 1) != 1:
            raise ExportError(
                f"{node.name} reads int4 blocks along an axis compress does not write; "
                "use embedding_lookup: blocked"
            )
        count = -(-width // block)  # the last block of a row may be padded
        if width % block:  # store the row padded to whole blocks; the lookup slices the padding off
            stored = numpy_helper.to_array(inits[table])
            padded = np.zeros((rows, count * block), dtype=stored.dtype)
            padded[:, :width] = stored
            inits[table].CopyFrom(numpy_helper.from_array(padded, table))
        blocks = [rows, count, 1]
        reshaped = {table: [rows, count, block], scales: blocks} | dict.fromkeys(zero_point, blocks)
        for name, dims in reshaped.items():  # the same values in the same order, the block its own axis
            del inits[name].dims[:]
            inits[name].dims.extend(dims)
        stem = node.name or table
        constants = {"shape": [rows, count * block]}
        if width % block:  # the Slice's bounds: only a padded table has one (no unused initializers)
            constants.update(start=[0], end=[width], axis=[1])
        for name, value in constants.items():
            graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), f"{stem}_{name}"))

        def op(kind: str, inputs: list[str], output: str, **attrs: Any) -> str:
            nodes.append(helper.make_node(kind, inputs, [output], name=f"{output}_{kind.lower()}", **attrs))
            return output

        values = op("Cast", [table], f"{stem}_values", to=onnx.TensorProto.FLOAT)
        if zero_point:
            zero = op("Cast", [zero_point[0]], f"{stem}_zero", to=onnx.TensorProto.FLOAT)
            values = op("Sub", [values, zero], f"{stem}_centred")
        scaled = op("Mul", [values, scales], f"{stem}_scaled")
        dense = op("Reshape", [scaled, f"{stem}_shape"], f"{stem}_table")
        if width % block:
            dense = op("Slice", [dense, f"{stem}_start", f"{stem}_end", f"{stem}_axis"], f"{stem}_unpadded")
        op("Gather", [dense, indices], node.output[0], axis=0)
        folded.append(table)
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(n.domain == "com.microsoft" for n in nodes):
        kept = [o for o in model.opset_import if o.domain != "com.microsoft"]
        del model.opset_import[:]
        model.opset_import.extend(kept)
    return folded


def float_lookup_tables(path: Path) -> list[str]:
    """Float initializers a ``Gather`` still reads (embedding tables left float)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    floats = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2}
    return [n.input[0] for n in graph.node if n.op_type == "Gather" and n.input[0] in floats]


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
    embedding_bits: int = 8,
    embedding_block: int = 32,
    embedding_lookup: Literal["fold", "blocked"] = "fold",
    name: str | None = None,
) -> dict[str, Any]:
    """Quantize the fp32 ONNX artifact at ``float_dir`` into an int8 artifact folder at ``out_dir``.

    ``op_types`` default: every supported type for dynamic, ``MatMul``/``Gemm`` for static.
    ``float_layers`` are module names whose nodes stay float (added to ``exclude_nodes``).
    ``embedding_bits=4`` stores the lookup tables int4 (``store_tables_int4``) instead of int8, read
    as ``embedding_lookup`` says (``fold_block_lookups``).
    """
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    if embedding_bits not in EMBEDDING_BITS:
        raise ExportError(f"embedding_bits {embedding_bits} is not one of {EMBEDDING_BITS}")
    if embedding_lookup not in LOOKUPS:
        raise ExportError(f"embedding_lookup {embedding_lookup!r} is not one of {LOOKUPS}")
    if op_types and embedding_bits == 4 and "Gather" not in op_types:
        raise ExportError(
            "embedding_bits: 4 quantizes the Gather tables, but op_types leaves Gather float; "
            "add Gather to op_types or use embedding_bits: 8"
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
    int8_types = op_types
    if embedding_bits == 4:  # the int8 pass leaves Gather float; store_tables_int4 takes the tables
        int8_types = [t for t in (op_types or sorted(IntegerOpsRegistry)) if t != "Gather"]
    with atomic_dir(out_dir) as folder:
        target = folder / "model.onnx"
        try:
            if scheme == "dynamic":
                quantize_dynamic(
                    source,
                    target,
                    op_types_to_quantize=int8_types,
                    per_channel=per_channel,
                    weight_type=QuantType.QInt8,
                    nodes_to_exclude=excluded,
                    extra_options={"DefaultTensorType": FLOAT},
                )
            else:
                quantize_static(
                    source,
                    target,
                    FeedReader(calibration),
                    quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=int8_types,
                    per_channel=per_channel,
                    nodes_to_exclude=excluded,
                    activation_type=QuantType.QInt8 if activations == "int8" else QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    calibrate_method=getattr(
                        CalibrationMethod, {"minmax": "MinMax"}.get(method, method.title())
                    ),
                    extra_options={"ActivationSymmetric": symmetric, "DefaultTensorType": FLOAT},
                )
            embedding = (
                store_tables_int4(target, embedding_block, embedding_lookup, excluded)
                if embedding_bits == 4
                else None
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
            "embedding": {**(embedding or {"bits": 8}), "float_tables": float_lookup_tables(target)},
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
