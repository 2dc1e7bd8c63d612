"""``type: export``: one fp32 artifact per recipe target, each checked against the PyTorch model.

The artifacts are what the quantize stage starts from and the float baseline evaluate compares
int8 artifacts with. Which file format, input dtype and sequence lengths each gets comes from the
target profile, never from stage options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from compress.errors import RecipeError
from compress.run_layout import artifact_dir_name, stage_dir_name
from compress.stages.base import StageConfig, StageContext, StageResult
from compress.stages.registry import register_stage


class ExportConfig(StageConfig):
    type: Literal["export"] = "export"
    targets: list[str] | None = None
    """Subset of the recipe's targets to export (default: all of them)."""
    check_samples: int = Field(32, gt=0)
    """Eval-split texts used as real inputs for the export check."""
    fuse: bool = False
    """ONNX targets: write ONNX Runtime's fused graph (multi-head attention, skip-layer-norm, bias-GELU,
    from onnxruntime.transformers' optimizer) when attention fuses in every layer; otherwise the
    unfused graph, with the reason logged and kept in the manifest's ``fusion``. Off by default until
    fused artifacts are measured no slower than unfused ones on the suite's models."""
    attention: Literal["separate", "packed"] = "separate"
    """With ``fuse``: how each layer's query/key/value projections are stored. separate: three MatMuls
    (ONNX Runtime's MultiHeadAttention), which every quantize scheme, float_layers and exclude_nodes
    can address; packed: one MatMul on a packed weight (ONNX Runtime's Attention), which dynamic int8
    turns into QAttention, one kernel per layer (10% off the headline's int8 runtime call on SST-2 and
    MRPC). Static and auto int8 need separate (``compress validate`` refuses them), and so do float_layers
    or exclude_nodes naming a query/key/value projection."""


def stage_targets(ctx: StageContext, names: list[str] | None, key: str) -> list[Any]:
    """The target profiles a stage works on: the recipe's, or the subset the stage names."""
    return select_targets(ctx.targets(), names, ctx.config.type, key)


def select_targets(profiles: list[Any], names: list[str] | None, stage_type: str, key: str) -> list[Any]:
    """``profiles`` (the recipe's targets), or the subset ``names`` lists; ``compress validate`` runs this
    on every export and quantize stage before anything trains, and the stage again when it runs."""
    if not profiles:
        raise RecipeError(f"{stage_type}: the recipe lists no targets; add e.g. targets: [arm64-onnx]")
    if names is None:
        return profiles
    if not names:
        raise RecipeError(f"{key}: is empty; list at least one of the recipe's targets or drop the key")
    known = {p.name: p for p in profiles}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise RecipeError(
            f"{key}: {unknown} are not in the recipe's targets {sorted(known)}; "
            "add them to targets or drop them here"
        )
    return [known[n] for n in names]


def artifact_name(ctx: StageContext, folder: str) -> str:
    """``<stage-dir>/<artifact-dir>``, e.g. ``04-export/arm64-onnx-fp32``, as other stages refer to it."""
    return f"{stage_dir_name(ctx.index, ctx.config.type)}/{folder}"


def check_texts(ctx: StageContext, count: int) -> tuple[list[str], list[str] | None]:
    split = ctx.split("eval")
    rows = list(range(min(count, len(split))))
    return [split.texts[i] for i in rows], [split.pairs[i] for i in rows] if split.pairs is not None else None


def export_float(
    ctx: StageContext,
    model: Any,
    tokenizer: Any,
    profile: Any,
    folder: Path,
    name: str,
    texts: list[str],
    pairs: list[str] | None,
    fuse: bool = ExportConfig.model_fields["fuse"].default,
    attention: str = ExportConfig.model_fields["attention"].default,
) -> dict[str, Any]:
    """Export one fp32 artifact for ``profile`` into ``folder`` (shared with the quantize stage, which
    exports with the export stage's defaults)."""
    from compress.export.artifact import source_info

    source = source_info(ctx.input_dir)
    if profile.format == "onnx":
        from compress.export.onnx import export_onnx

        max_length = min(profile.max_length, ctx.recipe.task.max_length)
        return export_onnx(
            model,
            tokenizer,
            folder,
            profile,
            name=name,
            texts=texts,
            pairs=pairs,
            max_length=max_length,
            source=source,
            fuse=fuse,
            attention=attention,
        )
    from compress.export.tflite import export_tflite

    return export_tflite(
        model, tokenizer, folder, profile, name=name, texts=texts, pairs=pairs, source=source
    )


def load_input_model(ctx: StageContext) -> tuple[Any, Any]:
    """The newest checkpoint (a ``share`` checkpoint comes back with its ties intact)."""
    from compress.models import load_classifier

    return load_classifier(ctx.input_dir, **ctx.recipe.teacher.load_options())


def artifact_metrics(manifest: dict[str, Any]) -> dict[str, Any]:
    model_file = next(e for e in manifest["files"] if e["path"].startswith("model."))
    return {"bytes": model_file["bytes"], "max_abs_diff": manifest["check"].get("max_abs_diff")}


@register_stage("export", ExportConfig, produces="artifacts")
def run(ctx: StageContext) -> StageResult:
    config: ExportConfig = ctx.config  # type: ignore[assignment]
    profiles = stage_targets(ctx, config.targets, "export.targets")
    model, tokenizer = load_input_model(ctx)
    texts, pairs = check_texts(ctx, config.check_samples)
    metrics: dict[str, Any] = {}
    fused: dict[str, bool] = {}
    for profile in profiles:
        folder = artifact_dir_name(profile.name, "fp32")
        manifest = export_float(
            ctx,
            model,
            tokenizer,
            profile,
            ctx.out_dir / folder,
            artifact_name(ctx, folder),
            texts,
            pairs,
            fuse=config.fuse,
            attention=config.attention,
        )
        metrics[folder] = artifact_metrics(manifest)
        if "fusion" in manifest:
            fused[folder] = manifest["fusion"]["applied"]
    return StageResult(metrics={"artifacts": metrics}, info={"artifacts": sorted(metrics), "fused": fused})
