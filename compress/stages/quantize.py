"""``type: quantize``: one int8 artifact per recipe target, accepted only within ``tolerable_loss``.

Each int8 artifact is derived from a checked fp32 artifact of the same target (the export stage's,
or one exported here) and measured against it on the eval split through the on-device runner.
A scheme the target does not allow, or an int8 artifact that loses more than ``tolerable_loss``,
stops the run unless ``allow_loss_miss`` says otherwise: a collapsed model is never written silently.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from compress.config import Strict
from compress.errors import ExportError, RecipeError
from compress.run_layout import MANIFEST_FILE, artifact_dir_name
from compress.stages.base import StageConfig, StageContext, StageResult
from compress.stages.export import artifact_name, check_texts, export_float, load_input_model, stage_targets
from compress.stages.registry import register_stage

log = logging.getLogger(__name__)


SchemeName = Literal["weight-only", "dynamic", "static", "auto"]


class Calibration(Strict):
    samples: int = Field(128, gt=0)
    """Training-split texts used to calibrate activation ranges (static and auto)."""
    method: Literal["minmax", "entropy", "percentile"] = "minmax"
    """ONNX static only; ai-edge-quantizer (TFLite) calibrates min/max."""


class QuantizeConfig(StageConfig):
    type: Literal["quantize"] = "quantize"
    scheme: SchemeName | dict[str, SchemeName] = "dynamic"
    """One scheme for every target, or a mapping from target name to scheme. weight-only: int8
    weights dequantized at load, float compute (TFLite; identical on every interpreter); dynamic:
    int8 weights, activations quantized at run time; static: int8 weights and activations; auto:
    static with the most sensitive layers kept float, found by an accuracy-aware search within
    tolerable_loss."""
    targets: list[str] | None = None
    calibration: Calibration = Field(default_factory=Calibration)
    op_types: list[str] | None = None
    """ONNX op types to quantize (default: all for dynamic, MatMul/Gemm for static)."""
    exclude_nodes: list[str] = Field(default_factory=list)
    """ONNX node names kept float."""
    full_integer: bool = False
    """TFLite static: quantize every op, not just the matmuls (forced for targets without float_fallback)."""
    float_layers: list[str] = Field(default_factory=list)
    """PyTorch module names (e.g. bert.encoder.layer.5.output.dense) kept float in every format."""
    tolerable_loss: float = Field(0.01, ge=0, lt=1)
    """Largest loss relative to the float artifact on the eval split (see metric)."""
    metric: Literal["agreement", "accuracy"] = "agreement"
    """agreement: loss = 1 - share of predictions kept; accuracy: relative accuracy drop."""
    allow_loss_miss: bool = False
    eval_samples: int | None = Field(None, gt=0)
    """Use only this many eval rows for the search and the agreement check (default: all)."""
    max_trials: int = Field(6, ge=1)
    """auto: how many float-layer candidates the search may try."""
    embedding_bits: Literal[8, 4] = 8
    """ONNX targets: 4 stores the embedding tables (what Gather reads) int4 in blocks of
    embedding_block values with a scale and zero point each (read as embedding_lookup says),
    about 0.64 of their int8 bytes at blocks of 32 (4 bits + a float32 scale and a 4-bit zero point per
    block); a lookup does no arithmetic, so it costs storage only. TFLite targets keep
    int8 tables (their runtimes' embedding kernels have no int4 path checked here). Not with auto."""
    embedding_block: int = Field(32, ge=16, le=1024)
    """Values per int4 block of an embedding row (a power of two)."""
    embedding_lookup: Literal["fold", "blocked"] = "fold"
    """How an ONNX graph reads int4 tables. fold: constant ops (Cast, Sub, Mul) on the int4 bytes that
    ONNX Runtime folds into a float table when it loads the file, so each call is a plain Gather (the
    file keeps the int4 bytes; the process holds the tables in float, vocab x hidden x 4 bytes);
    blocked: onnxruntime's GatherBlockQuantized dequantizes the rows it reads on every call (least
    memory, slower at batch 1)."""

    @field_validator("embedding_block")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError(f"embedding_block {value} is not a power of two; use one from 16 to 1024")
        return value

    @model_validator(mode="after")
    def _lookup_needs_int4(self) -> QuantizeConfig:
        if self.embedding_lookup == "blocked" and self.embedding_bits != 4:
            raise ValueError(
                "embedding_lookup: blocked says how int4 tables are read, and embedding_bits is 8; "
                "set embedding_bits: 4 or remove embedding_lookup"
            )
        return self


def schemes_by_target(config: QuantizeConfig, targets: list[str]) -> dict[str, str]:
    """The scheme this stage applies to each target; a mapping must name exactly the stage's targets."""
    if isinstance(config.scheme, str):
        return dict.fromkeys(targets, config.scheme)
    extra = sorted(set(config.scheme) - set(targets))
    if extra:
        raise RecipeError(
            f"quantize.scheme: '{extra[0]}' is not a target of this stage "
            f"({', '.join(targets)}); remove it or add it to targets"
        )
    missing = [t for t in targets if t not in config.scheme]
    if missing:
        raise RecipeError(
            f"quantize.scheme: no scheme for target '{missing[0]}' (the mapping names "
            f"{sorted(config.scheme)}); add '{missing[0]}: <scheme>' or give one scheme for all targets"
        )
    return {t: config.scheme[t] for t in targets}


def checked_schemes(config: QuantizeConfig, profiles: list[Any]) -> dict[str, str]:
    """The scheme of each of the stage's target profiles, each one allowed by its profile (the stage
    runs this, and ``compress validate`` before anything trains)."""
    schemes = schemes_by_target(config, [profile.name for profile in profiles])
    for profile in profiles:
        check_scheme(profile, config, schemes[profile.name])
    return schemes


def check_scheme(profile: Any, config: QuantizeConfig, scheme: str) -> None:
    """The target profile decides which schemes may ship to it."""
    needed = "static" if scheme == "auto" else scheme
    allowed = profile.quantization.schemes
    if needed not in allowed:
        raise RecipeError(
            f"quantize.scheme: target '{profile.name}' allows {allowed}, not '{scheme}'; "
            "use an allowed scheme or drop the target from this stage"
        )
    if config.embedding_bits == 4 and profile.format == "onnx" and scheme not in ("dynamic", "static"):
        raise RecipeError(
            f"quantize.embedding_bits: 4 is for the dynamic and static ONNX schemes, not '{scheme}' "
            f"(target '{profile.name}'); use embedding_bits: 8 or scheme: dynamic"
        )
    keeps_float = scheme == "auto" or config.float_layers or config.exclude_nodes
    if keeps_float and scheme not in ("dynamic", "weight-only") and not profile.quantization.float_fallback:
        raise RecipeError(
            f"quantize: target '{profile.name}' has float_fallback: false, so no layer may stay "
            "float; remove float_layers/exclude_nodes or use scheme: static"
        )


def calibration_rows(ctx: StageContext, samples: int) -> tuple[list[str], list[str] | None]:
    split = ctx.split("train")
    rows = sorted(random.Random(ctx.seed).sample(range(len(split)), min(samples, len(split))))
    return [split.texts[i] for i in rows], [split.pairs[i] for i in rows] if split.pairs is not None else None


def eval_rows(ctx: StageContext, limit: int | None) -> tuple[list[str], list[str] | None, list[int] | None]:
    split = ctx.split("eval")
    n = min(limit or len(split), len(split))
    pairs = split.pairs[:n] if split.pairs is not None else None
    return split.texts[:n], pairs, split.labels[:n] if split.labels is not None else None


def float_artifact(ctx: StageContext, model: Any, tokenizer: Any, profile: Any) -> Path:
    """The export stage's fp32 artifact for ``profile`` if made from this checkpoint, else a cached one."""
    from compress.export.artifact import source_info
    from compress.io import read_json, sha256_json

    name = artifact_dir_name(profile.name, "fp32")
    source = source_info(ctx.input_dir)
    exported = ctx.last("export")
    if exported is not None:
        folder = exported.dir / name
        if (folder / MANIFEST_FILE).is_file() and read_json(folder / MANIFEST_FILE)["source"] == source:
            return folder
    key = sha256_json([source, profile.model_dump(), ctx.recipe.task.max_length])[:16]
    folder = ctx.cache_dir / "float-artifacts" / f"{profile.name}-{key}"
    if not (folder / MANIFEST_FILE).is_file():
        texts, pairs = check_texts(ctx, 32)
        export_float(ctx, model, tokenizer, profile, folder, name, texts, pairs)
    return folder


def onnx_calibration(
    tokenizer: Any, names: list[str], texts: list[str], pairs: list[str] | None, max_length: int, dtype: str
) -> list[dict[str, Any]]:
    """Batches of 8 padded to one length: ORT's histogram calibrators need equal shapes."""
    from compress.export import encode_batch

    lengths = tokenizer(texts, pairs, truncation=True, max_length=max_length)["input_ids"]
    length = max(len(ids) for ids in lengths)
    batches = []
    for start in range(0, len(texts), 8):
        chunk_pairs = pairs[start : start + 8] if pairs is not None else None
        feeds = encode_batch(
            tokenizer, texts[start : start + 8], chunk_pairs, names, length=length, max_length=max_length
        )
        batches.append({k: v.astype(dtype) for k, v in feeds.items()})
    return batches


def quantize_target(
    ctx: StageContext,
    config: QuantizeConfig,
    profile: Any,
    float_dir: Path,
    out: Path,
    tokenizer: Any,
    names: list[str],
    chosen: str,
    search: Any | None,
) -> dict[str, Any]:
    """Write the int8 artifact for one target with scheme ``chosen``; return its manifest."""
    from compress.io import read_json

    float_manifest = read_json(float_dir / MANIFEST_FILE)
    scheme = "static" if chosen == "auto" else chosen
    # the profile's granularity rule is for integer kernels; weight-only computes in float
    per_channel = profile.quantization.granularity == "per-channel" or scheme == "weight-only"
    name = artifact_name(ctx, out.name)
    search = search if chosen == "auto" else None
    float_layers = search.float_layers if search else list(config.float_layers)
    texts, pairs = calibration_rows(ctx, config.calibration.samples)
    if profile.format == "onnx":
        if search is not None:
            from compress.quantize.pt2e_onnx import export_search_winner

            return export_search_winner(search, float_dir, out, name=name, profile=profile)
        from compress.quantize.onnx import quantize_onnx

        dtype = float_manifest["inputs"][0]["dtype"]
        calibration = (
            onnx_calibration(tokenizer, names, texts, pairs, float_manifest["max_length"], dtype)
            if scheme == "static"
            else None
        )
        return quantize_onnx(
            float_dir,
            out,
            scheme=scheme,
            calibration=calibration,
            method=config.calibration.method,
            op_types=config.op_types,
            exclude_nodes=config.exclude_nodes,
            float_layers=float_layers,
            per_channel=per_channel,
            activations=profile.quantization.activations,
            embedding_bits=config.embedding_bits,
            embedding_block=config.embedding_block,
            embedding_lookup=config.embedding_lookup,
            name=name,
        )
    from compress.quantize.tflite import quantize_tflite, signature_feeds

    calibration = (
        signature_feeds(tokenizer, names, texts, pairs, float_manifest["sequence_lengths"])
        if scheme == "static"
        else None
    )
    return quantize_tflite(
        float_dir,
        out,
        scheme=scheme,
        calibration=calibration,
        float_layers=float_layers,
        per_channel=per_channel,
        full_integer=config.full_integer or not profile.quantization.float_fallback,
        name=name,
        profile=profile,
    )


def measure(
    float_dir: Path,
    int8_dir: Path,
    rows: tuple[list[str], list[str] | None, list[int] | None],
    metric: str,
    model: str | None = None,
) -> dict[str, Any]:
    """Agreement of ``int8_dir``'s model (its primary, or fallback file ``model``) with the float source."""
    from compress.quantize import agreement, predict_logits, relative_loss
    from compress.runtime.runner import load

    texts, pairs, labels = rows
    if model is None:
        got = predict_logits(int8_dir, texts, pairs)
    else:
        got = load(int8_dir, threads=2, model=model).predict_logits(texts, pairs, batch_size=1)
    measured = agreement(predict_logits(float_dir, texts, pairs), got, labels)
    measured["relative_loss"] = relative_loss(measured, metric if labels is not None else "agreement")
    return measured


def record_agreement(folder: Path, manifest: dict[str, Any], measured: dict[str, Any]) -> None:
    """Keep the eval-split agreement with the float source in the artifact's own manifest."""
    from compress.io import write_json_atomic

    manifest["check"] = {**manifest.get("check", {}), "eval": measured}
    write_json_atomic(folder / MANIFEST_FILE, manifest)


def measure_fallbacks(
    float_dir: Path, out: Path, manifest: dict[str, Any], rows: Any, metric: str
) -> dict[str, dict[str, Any]]:
    """Each fallback model's eval-split agreement with the float source, kept in its manifest entry."""
    measured = {}
    for entry in manifest.get("fallbacks", []):
        if entry["path"] not in measured:
            measured[entry["path"]] = measure(float_dir, out, rows, metric, model=entry["path"])
        entry["check"] = {"eval": measured[entry["path"]]}
    return measured


def model_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("model.*"))


@register_stage("quantize", QuantizeConfig, produces="artifacts")
def run(ctx: StageContext) -> StageResult:
    config: QuantizeConfig = ctx.config  # type: ignore[assignment]
    profiles = stage_targets(ctx, config.targets, "quantize.targets")
    schemes = checked_schemes(config, profiles)
    model, tokenizer = load_input_model(ctx)
    from compress.export import input_names

    names = input_names(model)
    rows = eval_rows(ctx, config.eval_samples)
    search = None
    if "auto" in schemes.values():
        from compress.quantize.search import search_float_layers

        search = search_float_layers(
            model,
            tokenizer,
            calibration_rows(ctx, config.calibration.samples),
            rows,
            tolerable_loss=config.tolerable_loss,
            metric=config.metric,
            max_trials=config.max_trials,
            max_length=ctx.recipe.task.max_length,
            fixed_layers=config.float_layers,
        )
    metrics: dict[str, Any] = {}
    for profile in profiles:
        float_dir = float_artifact(ctx, model, tokenizer, profile)
        out = ctx.out_dir / artifact_dir_name(profile.name, "int8")
        scheme = schemes[profile.name]
        manifest = quantize_target(ctx, config, profile, float_dir, out, tokenizer, names, scheme, search)
        measured = measure(float_dir, out, rows, config.metric)
        fallbacks = measure_fallbacks(float_dir, out, manifest, rows, config.metric)
        record_agreement(out, manifest, measured)
        metrics[out.name] = {
            **measured,
            "bytes": model_bytes(out),
            "float_bytes": model_bytes(float_dir),
            "scheme": scheme,
            "float_layers": manifest["quantization"]["float_layers"],
        }
        for path, fallback in fallbacks.items():
            metrics[out.name].setdefault("fallbacks", {})[path] = {
                **fallback,
                "bytes": (out / path).stat().st_size,
            }
    info = {
        "search": search.summary() if search else None,
        "metric": config.metric,
        "tolerable_loss": config.tolerable_loss,
    }
    losses = {k: m["relative_loss"] for k, m in metrics.items()}
    losses |= {
        f"{k}/{path}": f["relative_loss"]
        for k, m in metrics.items()
        for path, f in m.get("fallbacks", {}).items()
    }
    missed = {k: loss for k, loss in losses.items() if loss > config.tolerable_loss}
    if missed and not config.allow_loss_miss:
        worst = max(missed, key=missed.get)
        raise ExportError(
            f"quantize: {worst} loses {missed[worst]:.2%} ({config.metric}) against its float "
            f"source, over tolerable_loss {config.tolerable_loss:.2%}; use scheme: auto, keep "
            "layers float (float_layers) or set allow_loss_miss: true to keep it anyway"
        )
    if missed:
        log.warning("quantize: kept int8 artifacts over tolerable_loss (allow_loss_miss): %s", missed)
    return StageResult(metrics={"artifacts": metrics}, info={**info, "loss_missed": sorted(missed)})
