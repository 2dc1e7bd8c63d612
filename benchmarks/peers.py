"""The rows compress must beat: the teacher in float, and the teacher through the int8 one-liners users know.

Each peer is written as an artifact folder (the contract in compress.export.artifact), so the suite
measures it with the same evaluation path as compress's own artifacts; only the tool that produced
the model file differs. The float exports go through compress's exporters so that every row starts
from the same graph: the comparison is about compression, not about who traces BERT better.
The neural-compressor row is a PyTorch program and lives in ``torch_int8.py``.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compress.io import atomic_dir, file_entries, read_json, write_json_atomic


@dataclass(frozen=True)
class Built:
    """A peer model folder and what building it cost (the user's side of the comparison)."""

    path: Path
    seconds: float
    tool: str


def export_teacher(
    teacher_dir: Path, out_dir: Path, targets: dict[str, str], texts: list[str], pairs: list[str] | None
) -> dict[str, Built]:
    """The teacher as fp32 ONNX and TFLite artifacts for the given ``{format: target profile}``.

    ``texts``/``pairs`` are training rows for the exporters' own PyTorch-vs-artifact check.
    """
    from compress.export.artifact import source_info
    from compress.export.onnx import export_onnx
    from compress.export.tflite import export_tflite
    from compress.models import load_classifier
    from compress.targets import load_target

    model, tokenizer = load_classifier(teacher_dir)
    exporters = {"onnx": export_onnx, "tflite": export_tflite}
    built = {}
    for fmt, target in targets.items():
        start = time.time()
        folder = out_dir / f"teacher-{fmt}-fp32"
        exporters[fmt](
            model,
            tokenizer,
            folder,
            load_target(target),
            name=folder.name,
            texts=texts,
            pairs=pairs,
            source=source_info(teacher_dir),
        )
        built[fmt] = Built(folder, time.time() - start, f"compress.export ({target})")
    return built


def quantized_copy(
    float_dir: Path, out_dir: Path, model_name: str, write_model: Any, quantization: dict[str, Any]
) -> Path:
    """An int8 artifact folder beside a float one: same tokenizer, labels and inputs, a new model file.

    ``write_model(src, dst)`` writes the quantized model file; the manifest is the float one with
    precision, quantization, name and file hashes updated, so the runner verifies and loads it.
    """
    manifest = read_json(float_dir / "manifest.json")
    with atomic_dir(out_dir) as folder:
        for name in ("tokenizer.json", "labels.json"):
            shutil.copy2(float_dir / name, folder / name)
        write_model(float_dir / model_name, folder / model_name)
        manifest.update(
            name=out_dir.name,
            precision="int8",
            quantization=quantization,
            check={"source": manifest["name"], "note": "quantized by a peer tool; not checked by compress"},
            files=file_entries(folder),
        )
        write_json_atomic(folder / "manifest.json", manifest)
    return out_dir


def ort_dynamic_int8(float_dir: Path, out_dir: Path) -> Built:
    """onnxruntime's dynamic int8 with per-channel int8 weights: Optimum's arm64 preset, as one call."""

    def write(src: Path, dst: Path) -> None:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(src, dst, per_channel=True, weight_type=QuantType.QInt8)

    start = time.time()
    quantization = {
        "scheme": "dynamic",
        "granularity": "per-channel",
        "calibration": None,
        "float_layers": [],
        "tool": "onnxruntime.quantization.quantize_dynamic(per_channel=True, weight_type=QInt8)",
    }
    path = quantized_copy(float_dir, out_dir, "model.onnx", write, quantization)
    return Built(path, time.time() - start, quantization["tool"])


def aeq_dynamic_int8(float_dir: Path, out_dir: Path) -> Built:
    """ai-edge-quantizer's dynamic-range recipe: int8 per-channel weights, activations quantized live."""

    def write(src: Path, dst: Path) -> None:
        from ai_edge_quantizer import quantizer, recipe

        qt = quantizer.Quantizer(str(src))
        qt.load_quantization_recipe(recipe.dynamic_wi8_afp32())
        qt.quantize(enable_progress_report=False).export_model(str(dst), overwrite=True)

    start = time.time()
    quantization = {
        "scheme": "dynamic",
        "granularity": "per-channel",
        "calibration": None,
        "float_layers": [],
        "tool": "ai_edge_quantizer recipe.dynamic_wi8_afp32()",
    }
    path = quantized_copy(float_dir, out_dir, "model.tflite", write, quantization)
    return Built(path, time.time() - start, quantization["tool"])


def ort_fused_dynamic_int8(teacher_dir: Path, float_dir: Path, out_dir: Path) -> Built:
    """What an ONNX Runtime expert ships: Optimum's recipe (TorchScript export of eager attention, ORT's
    transformer optimizer fusing attention, embedding/skip layer norms and bias-GELU, then per-channel
    dynamic int8), built with onnxruntime's own optimizer and quantizer.

    The dynamo exporter's attention does not match ORT's fusion patterns; the TorchScript exporter with
    eager attention (what ``optimum-cli export onnx`` runs) does. ``opt_level=0`` applies the portable
    Python fusions only: the extended graph optimizations that O2 adds are what every ONNX Runtime
    session applies at load time anyway, on the board's own execution provider.
    """
    manifest = read_json(float_dir / "manifest.json")
    names = [spec["name"] for spec in manifest["inputs"]]

    def write(src: Path, dst: Path) -> None:
        import tempfile

        import numpy as np
        import onnx
        import onnxruntime as ort
        import torch
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.transformers import optimizer
        from onnxruntime.transformers.fusion_options import FusionOptions

        from compress.models import load_classifier

        model, _ = load_classifier(teacher_dir)
        model.set_attn_implementation("eager")
        config = model.config
        example = tuple(torch.ones(1, 16, dtype=torch.long) for _ in names)
        axes = {name: {0: "batch", 1: "sequence"} for name in names}
        with tempfile.TemporaryDirectory() as tmp:
            exported, fused = Path(tmp) / "export.onnx", Path(tmp) / "fused.onnx"
            torch.onnx.export(
                model,
                example,
                str(exported),
                input_names=names,
                output_names=["logits"],
                dynamic_axes={**axes, "logits": {0: "batch"}},
                opset_version=17,
                dynamo=False,
            )
            optimized = optimizer.optimize_model(
                str(exported),
                model_type="bert",
                num_heads=config.num_attention_heads,
                hidden_size=config.hidden_size,
                optimization_options=FusionOptions("bert"),
                opt_level=0,
            )
            fusions = {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}
            if not fusions.get("Attention"):
                raise SystemExit(
                    f"{teacher_dir}: ORT's optimizer fused no attention ({fusions}); the peer would not be O2"
                )
            optimized.save_model_to_file(str(fused))
            # the fused float graph must still compute the teacher (the int8 step after it is the peer's loss)
            feed = {name: np.ones((2, 24), dtype=np.int64) for name in names}
            feed["input_ids"] = np.random.default_rng(0).integers(
                1, config.vocab_size, (2, 24), dtype=np.int64
            )
            want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feed)[0]
            got = ort.InferenceSession(str(fused), providers=["CPUExecutionProvider"]).run(None, feed)[0]
            if not np.allclose(got, want, atol=1e-3, rtol=1e-3):
                raise SystemExit(
                    f"{teacher_dir}: the fused graph differs from the export by {abs(got - want).max()}"
                )
            # shape inference cannot type the outputs of ORT's contrib ops (Attention, SkipLayerNorm):
            # tell the quantizer they are float, as Optimum's quantizer does for fused graphs
            quantize_dynamic(
                fused,
                dst,
                per_channel=True,
                weight_type=QuantType.QInt8,
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        quantization["fusions"] = fusions

    start = time.time()
    quantization: dict[str, Any] = {
        "scheme": "dynamic",
        "granularity": "per-channel",
        "calibration": None,
        "float_layers": [],
        "tool": "torch.onnx.export(dynamo=False, eager attention) + onnxruntime.transformers.optimizer"
        ".optimize_model(bert) + quantize_dynamic(per_channel=True, weight_type=QInt8)",
    }
    path = quantized_copy(float_dir, out_dir, "model.onnx", write, quantization)
    return Built(path, time.time() - start, quantization["tool"])
