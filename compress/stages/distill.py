"""``distill``: a shallower student initialised from the teacher's layers and trained to match it.

DistilBERT's recipe (every-other layer init, soft targets, hidden-state cosine) with TinyBERT's
options (projected hidden MSE, attention maps, augmentation, the two-step order) and MiniLM's
self-attention relations as loss weights and options in the config.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from compress.distill.config import DistillOptions
from compress.errors import DataError, ModelError, RecipeError
from compress.models import count_parameters, load_classifier, save_checkpoint
from compress.stages.base import StageConfig, StageContext, StageResult
from compress.stages.registry import register_stage


class DistillConfig(StageConfig, DistillOptions):
    type: Literal["distill"] = "distill"
    layers: int = Field(3, gt=0)
    init: Literal["every-other", "random"] | list[int] = "every-other"
    """Teacher layers (0-based) to copy into the student, one per student layer."""
    hidden_size: int | None = Field(None, gt=0)
    intermediate_size: int | None = Field(None, gt=0)


@register_stage("distill", DistillConfig)
def run(ctx: StageContext) -> StageResult:
    # torch and the loop are imported here so that validating a recipe stays fast.
    from compress.distill.student import build_student
    from compress.distill.trainer import distill_model
    from compress.training import set_seed

    cfg: DistillConfig = ctx.config  # type: ignore[assignment]
    start = time.time()
    source, tokenizer = load_classifier(ctx.input_dir, **ctx.recipe.teacher.load_options())
    train, teacher_labels = ctx.split("train"), source.config.num_labels
    if train.labels is not None and len(train.label_names) > teacher_labels:
        raise DataError(
            f"{train.source}: the data has {len(train.label_names)} labels {train.label_names} but the "
            f"teacher has {teacher_labels}; distil a teacher trained on these labels (add a finetune "
            "stage) or fix the data"
        )
    set_seed(ctx.seed)
    try:
        student, built = build_student(
            source, cfg.layers, cfg.init, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size
        )
    except ModelError as exc:
        raise RecipeError(f"{ctx.where()}.{exc}") from None
    try:
        outcome = distill_model(student, tokenizer, ctx.teacher_dir, ctx, cfg)
    except RecipeError as exc:
        raise RecipeError(f"{ctx.where()}.{exc}") from None
    if outcome.is_main_process:
        save_checkpoint(student, tokenizer, ctx.out_dir)
    metrics = {
        **outcome.metrics,
        "parameters": count_parameters(student),
        "source_parameters": count_parameters(source),
        "wall_time_s": round(time.time() - start, 2),
    }
    info = {
        **outcome.info,
        "student": {k: v for k, v in built.items() if k != "fresh_tensors"},
        "fresh_tensors": len(built["fresh_tensors"]),
    }
    return StageResult(metrics=metrics, info=info)
