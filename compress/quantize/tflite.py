"""TFLite int8 with ai-edge-quantizer: weight-only, dynamic-range or full-integer static with calibration.

``weight-only`` stores int8 weights that the interpreter dequantizes once at load time, so every op
computes in float: a quarter of the bytes, float speed, and the same logits on every interpreter
(tflite-runtime 2.14 on a Pi gives the host's numbers to 1e-8, where its dynamic-range kernels
return zeros for per-channel weights and round activations differently for per-tensor ones).
A target profile's ``fallbacks`` put such a second model into the same artifact folder
(``fallback-<scheme>.tflite``) for the interpreters that compute the primary ``model.tflite`` wrongly;
the manifest says which model is for which interpreter and why.

Layers stay float through recipe scopes: ai-edge-quantizer matches a regex against each op's
output tensor names, which litert-torch builds from the module path (``..._encoder/..._3/...``).
``layer_scope`` turns a PyTorch module name into that regex, so the float-layer decision made on the
PyTorch model (the accuracy-aware search) applies to the TFLite file too. The op producing the
logits always stays float, so the artifact's output is float32 like its source's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import numpy as np

from compress.errors import ExportError
from compress.io import atomic_dir, write_json_atomic
from compress.quantize import derive_artifact
from compress.quantize.constants import require_int8_constants, tflite_float_constants
from compress.quantize.tflite_compact import compact_tflite
from compress.run_layout import MANIFEST_FILE

LOGITS_SCOPE = r"_logits_output(;|$)"
STATIC_OPS = ["FULLY_CONNECTED", "BATCH_MATMUL"]
"""Static default: int8 matmuls, float LayerNorm/Softmax/GELU. Full-integer (every op int8) dropped the
SST-2 MiniLM teacher to 82% agreement; matmuls only kept 97% (300 dev rows)."""
TABLE_OPS = ["EMBEDDING_LOOKUP"]
"""Static (full-integer too) also stores the embedding tables int8, weight-only: a lookup only copies
rows, so nothing is computed in int8, but without it the word table (V x H floats, 47 MB for a
BERT vocabulary at H=384) stays fp32 and the static file is 2.5x the size of the dynamic one."""


def layer_scope(module_name: str) -> str:
    """Regex for the ops traced from ``module_name`` (e.g. ``bert.encoder.layer.3.intermediate``).

    A container name followed by an index (``layer.3``) leaves no scope segment of its own, so it is
    dropped; other segments may sit in between because wrappers add their own.
    """
    parts = module_name.split(".")
    kept = [p for i, p in enumerate(parts) if not (i + 1 < len(parts) and parts[i + 1].isdigit())]
    segments = [rf"[^/;]*_{re.escape(p)}" for p in kept]
    return r"(^|[/;])" + r"/(?:[^/;]*/)*".join(segments) + r"(?=[/;]|$)"


def signature_feeds(
    tokenizer: Any, names: list[str], texts: list[str], pairs: list[str] | None, lengths: list[int]
) -> dict[str, list[dict[str, np.ndarray]]]:
    """Calibration samples per signature: each text goes to the smallest length that holds it (as the
    runner does), and every signature gets at least one sample so each has activation ranges."""
    from compress.export import encode_batch
    from compress.export.tflite import signature_name

    counts = [
        len(ids) for ids in tokenizer(texts, pairs, truncation=True, max_length=max(lengths))["input_ids"]
    ]
    groups: dict[int, list[int]] = {n: [] for n in lengths}
    for i, count in enumerate(counts):
        groups[next(n for n in lengths if n >= count)].append(i)
    for n in lengths:
        groups[n] = groups[n] or list(range(min(4, len(texts))))

    def sample(i: int, n: int) -> dict[str, np.ndarray]:
        feeds = encode_batch(
            tokenizer, [texts[i]], [pairs[i]] if pairs else None, names, length=n, max_length=n
        )
        return {k: v.astype(np.int32) for k, v in feeds.items()}

    return {signature_name(n): [sample(i, n) for i in rows] for n, rows in groups.items()}


def build_quantizer(
    source: Path, scheme: str, per_channel: bool, float_layers: list[str], full_integer: bool
) -> Any:
    from ai_edge_quantizer import qtyping, quantizer
    from ai_edge_quantizer.algorithm_manager import AlgorithmName

    every = qtyping.TFLOperationName.ALL_SUPPORTED
    granularity = qtyping.QuantGranularity.CHANNELWISE if per_channel else qtyping.QuantGranularity.TENSORWISE
    q = quantizer.Quantizer(str(source))
    if scheme == "weight-only":
        q.add_weight_only_config(".*", every, num_bits=8, granularity=granularity)
    elif scheme == "dynamic":
        q.add_dynamic_config(".*", every, num_bits=8, granularity=granularity)
    else:
        ops = [every] if full_integer else [qtyping.TFLOperationName(op) for op in STATIC_OPS]
        for op in ops:
            q.add_static_config(
                ".*", op, activation_num_bits=8, weight_num_bits=8, weight_granularity=granularity
            )
        for op in TABLE_OPS:  # no static policy covers a lookup table: full-integer files too
            q.add_weight_only_config(".*", qtyping.TFLOperationName(op), num_bits=8, granularity=granularity)
        q.update_quantization_recipe(LOGITS_SCOPE, every, algorithm_key=AlgorithmName.NO_QUANTIZE)
    for layer in float_layers:
        q.update_quantization_recipe(layer_scope(layer), every, algorithm_key=AlgorithmName.NO_QUANTIZE)
    return q


def check_float_outputs(path: Path) -> None:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    for key in interpreter.get_signature_list():
        dtype = interpreter.get_signature_runner(key).get_output_details()["logits"]["dtype"]
        if np.dtype(dtype) != np.float32:
            raise ExportError(
                f"{path.name}: signature {key} returns {np.dtype(dtype).name} logits, not float32"
            )


def fallback_file(scheme: str) -> str:
    return f"fallback-{scheme}.tflite"


def write_model(q: Any, scheme: str, calibration: dict[str, Any] | None, target: Path) -> None:
    try:
        qsvs = q.calibrate(calibration, num_threads=2) if scheme == "static" else None
        q.quantize(qsvs, enable_progress_report=False).export_model(str(target), overwrite=True)
    except ExportError:
        raise
    except Exception as exc:
        raise ExportError(
            f"ai-edge-quantizer {scheme} quantization failed: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}"
        ) from None
    check_float_outputs(target)


def write_checked(
    q: Any,
    scheme: str,
    calibration: dict[str, Any] | None,
    path: Path,
    float_layers: list[str],
    artifact: str | None = None,
) -> dict[str, Any]:
    """Write an int8 model, fail it for a large float constant the recipe did not keep float, then compact
    it (``tflite_compact``: names are needed by the check's scopes, so the check comes first).

    Returns the float constants it keeps on purpose (``kept_float``) and the compaction's bytes.
    """
    write_model(q, scheme, calibration, path)
    scopes = [LOGITS_SCOPE, *(layer_scope(layer) for layer in float_layers)]
    require_int8_constants(artifact or path.name, tflite_float_constants(path, scopes))
    kept = tflite_float_constants(path)
    return {"kept_float": kept, "compaction": compact_tflite(path)}


def quantization_record(
    scheme: str,
    per_channel: bool,
    full_integer: bool,
    calibration: dict[str, list[Any]] | None,
    float_layers: list[str],
    kept_float: dict[str, int],
    compaction: dict[str, int],
) -> dict[str, Any]:
    return {
        "tool": "ai-edge-quantizer",
        "scheme": scheme,
        "granularity": "per-channel" if per_channel else "per-tensor",
        "weights": "int8",
        "activations": {"static": "int8", "dynamic": "dynamic"}.get(scheme, "float"),
        "op_types": ("all" if full_integer else STATIC_OPS + TABLE_OPS) if scheme == "static" else "all",
        "calibration": {"samples": sum(len(v) for v in calibration.values()), "method": "minmax"}
        if scheme == "static" and calibration
        else None,
        "float_layers": float_layers,
        "float_constant_bytes": sum(kept_float.values()),
        "compaction": compaction,
    }


def write_fallbacks(
    float_dir: Path,
    folder: Path,
    profile: Any,
    scheme: str,
    per_channel: bool,
    float_layers: list[str],
    calibration: dict[str, list[Any]] | None,
    full_integer: bool,
) -> list[dict[str, Any]]:
    """The second model for each of ``profile``'s fallback rules that ``scheme`` triggers; one file per
    fallback scheme, each loaded in its interpreter here when that interpreter is installed."""
    from compress.export.tflite import runtime_contract

    entries = []
    written: dict[str, dict[str, Any]] = {}  # one file per fallback scheme, whichever rules name it
    for rule in profile.fallbacks_for(scheme):
        path = folder / fallback_file(rule.scheme)
        channels = per_channel or rule.scheme == "weight-only"
        if path.name not in written:
            q = build_quantizer(float_dir / "model.tflite", rule.scheme, channels, float_layers, full_integer)
            written[path.name] = write_checked(q, rule.scheme, calibration, path, float_layers)
        entries.append(
            {
                "path": path.name,
                "interpreter": rule.interpreter,
                "below": rule.below,
                "scheme": rule.scheme,
                "reason": rule.reason,
                "quantization": quantization_record(
                    rule.scheme, channels, full_integer, calibration, float_layers, **written[path.name]
                ),
                "runtime": runtime_contract(path, [rule.interpreter], profile.name),
            }
        )
    return entries


def quantize_tflite(
    float_dir: Path,
    out_dir: Path,
    *,
    scheme: Literal["weight-only", "dynamic", "static"],
    calibration: dict[str, list[dict[str, np.ndarray]]] | None = None,
    float_layers: list[str] | None = None,
    per_channel: bool = True,
    full_integer: bool = False,
    name: str | None = None,
    profile: Any | None = None,
) -> dict[str, Any]:
    """Quantize the fp32 TFLite artifact at ``float_dir`` into an int8 artifact folder at ``out_dir``.

    ``calibration`` maps signature name (``seq_128``) to input samples; static needs it.
    ``float_layers`` are PyTorch module names kept in float (see ``layer_scope``). Static quantizes
    the matmuls (``STATIC_OPS``) and stores the embedding tables int8 (``TABLE_OPS``, weight-only) unless
    ``full_integer`` asks for every op (targets without float ops). With a target ``profile``, the
    manifest gets the runtime contract of each model and the fallback models its rules ask for.
    """
    from compress.export.tflite import runtime_contract

    float_layers = list(float_layers or [])
    if scheme == "static" and not calibration:
        raise ExportError("static int8 needs calibration samples; set calibration.samples > 0")
    q = build_quantizer(float_dir / "model.tflite", scheme, per_channel, float_layers, full_integer)
    with atomic_dir(out_dir) as folder:
        target = folder / "model.tflite"
        artifact = name or Path(out_dir).name
        written = write_checked(q, scheme, calibration, target, float_layers, artifact)
        quantization = quantization_record(
            scheme, per_channel, full_integer, calibration, float_layers, **written
        )
        fallbacks = (
            write_fallbacks(
                float_dir, folder, profile, scheme, per_channel, float_layers, calibration, full_integer
            )
            if profile is not None
            else []
        )
        diverted = {entry["interpreter"] for entry in fallbacks}
        named = profile.interpreters if profile is not None else ["ai_edge_litert"]
        runtime = runtime_contract(
            target, [i for i in named if i not in diverted], profile.name if profile else artifact
        )
        manifest = derive_artifact(float_dir, folder, name=artifact, quantization=quantization)
        # the float source's runtime contract is its own; this folder's models get theirs
        manifest = {
            **{k: v for k, v in manifest.items() if k != "files"},
            "runtime": runtime,
            **({"fallbacks": fallbacks} if fallbacks else {}),
            "files": manifest["files"],
        }
        write_json_atomic(folder / MANIFEST_FILE, manifest)
    return manifest
