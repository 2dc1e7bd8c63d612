"""The searched PT2E int8 model as an ONNX artifact: ``torch.onnx.export(dynamo=True)``, int8 weights on disk.

neural-compressor's PT2E ``convert`` keeps float weights and quantizes them at run time; exporting
that graph as is would ship a float-sized file. onnxruntime's basic (hardware-independent) constant
folding turns each constant QuantizeLinear into an int8 initializer before the file is written, and
the embedding tables (which PT2E leaves float) are then stored int8 like the ``static`` scheme's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compress.quantize.search import SearchResult, logits_of

INT8_ATOL, INT8_RTOL = 0.3, 0.1
"""PyTorch simulates int8 in float (quantize-dequantize); onnxruntime runs fused int8 kernels that round
and requantize differently: on the SST-2 MiniLM teacher logits moved by up to 0.14. A mis-lowered graph
moves them by whole units; whether predictions survive is the stage's eval agreement check."""


def fold_weights(raw: Path, target: Path) -> None:
    """Write ``raw`` to ``target`` with constant QuantizeLinear nodes folded into int8 initializers."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(target)
    options.log_severity_level = 3
    ort.InferenceSession(str(raw), options, providers=["CPUExecutionProvider"])


def export_search_winner(
    search: SearchResult, float_dir: Any, out_dir: Any, *, name: str, profile: Any
) -> dict[str, Any]:
    """Export the searched PT2E int8 model as an int8 ONNX artifact derived from ``float_dir``."""
    import torch

    from compress.export import conversion_error
    from compress.export.check import compare_outputs
    from compress.export.onnx import onnx_runner, tidy_onnx
    from compress.io import atomic_dir
    from compress.quantize import derive_artifact
    from compress.quantize.constants import onnx_float_constants, require_int8_constants
    from compress.quantize.onnx import nodes_in_layers, store_tables_int8

    names = [
        n for n, _ in zip(("input_ids", "attention_mask", "token_type_ids"), search.example, strict=False)
    ]
    batch = torch.export.Dim("batch", min=1, max=4096)
    sequence = torch.export.Dim("sequence", min=1, max=search.max_positions)
    with atomic_dir(Path(out_dir)) as folder:
        raw, folded, path = folder / "traced.onnx", folder / "folded.onnx", folder / "model.onnx"
        try:
            program = torch.onnx.export(
                search.model,
                tuple(t.to(getattr(torch, profile.input_dtype)) for t in search.example),
                input_names=names,
                output_names=["logits"],
                dynamo=True,
                opset_version=profile.opset,
                dynamic_shapes=tuple({0: batch, 1: sequence} for _ in names),
                verbose=False,
            )
        except Exception as exc:
            raise conversion_error("onnx", exc) from None
        program.save(str(raw), external_data=False)
        fold_weights(raw, folded)
        store_tables_int8(folded, path)
        raw.unlink()
        folded.unlink()
        merged = tidy_onnx(path)
        kept_float = onnx_float_constants(path)
        float_nodes = nodes_in_layers(path, search.float_layers)
        require_int8_constants(name, onnx_float_constants(path, float_nodes, search.float_weights))
        cases = [
            dict(zip(names, (t.numpy() for t in batch_), strict=True)) for batch_ in search.check_batches
        ]
        check = compare_outputs(
            lambda f: logits_of(search.model, [tuple(torch.from_numpy(f[n]) for n in names)]).numpy(),
            onnx_runner(path),
            cases,
            what=f"{path.name} (int8) export check",
            atol=INT8_ATOL,
            rtol=INT8_RTOL,
        )
        quantization = {
            "tool": "neural_compressor.torch (PT2E static int8) -> torch.onnx.export(dynamo=True)",
            "scheme": "static",
            "granularity": "per-channel",
            "weights": "int8",
            "activations": "uint8",
            "calibration": {"samples": search.calibration_samples, "method": "minmax"},
            "float_layers": search.float_layers,
            "float_constant_bytes": sum(kept_float.values()),
            "search": {k: v for k, v in search.summary().items() if k != "sensitivity"},
        }
        manifest = derive_artifact(
            Path(float_dir),
            folder,
            name=name,
            quantization=quantization,
            check={**check, "merged_initializers": merged},
        )
    return manifest
