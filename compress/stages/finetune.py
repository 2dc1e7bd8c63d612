"""``finetune``: train a base encoder into the task's teacher classifier.

Runs only when the recipe's teacher is not yet a classifier for the task's labels (``when:
untrained``), so the same recipe works for a base checkpoint and for an already fine-tuned one.
The output becomes the teacher of every later stage. Heavy imports live inside the handler so that
validating a recipe does not pay for torch.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Literal

from pydantic import Field

from compress.errors import DataError
from compress.stages.base import StageConfig, StageContext, StageResult
from compress.stages.registry import register_stage

log = logging.getLogger(__name__)


class FinetuneConfig(StageConfig):
    type: Literal["finetune"] = "finetune"
    when: Literal["untrained", "always"] = "untrained"
    epochs: int = Field(3, gt=0, le=1000)
    batch_size: int = Field(32, gt=0, le=65536)
    lr: float = Field(5e-5, gt=0, lt=1)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, le=1)
    max_grad_norm: float = Field(1.0, gt=0)


def _copy_files(source: Path, dest: Path) -> None:
    for item in source.iterdir():
        if item.is_file():
            shutil.copy2(item, dest / item.name)


def _copy_teacher(ctx: StageContext) -> None:
    """The teacher as this stage's checkpoint; pickle weights (allowed by the recipe) are unpickled
    here once and saved as safetensors, so no later stage or evaluation ever unpickles."""
    from compress.model_folder import WEIGHT_FILES_SAFE
    from compress.models import load_classifier, save_checkpoint

    if any((ctx.teacher_dir / name).is_file() for name in WEIGHT_FILES_SAFE):
        _copy_files(ctx.teacher_dir, ctx.out_dir)
        return
    teacher = ctx.recipe.teacher
    model, tokenizer = load_classifier(ctx.teacher_dir, **teacher.load_options())
    save_checkpoint(model, tokenizer, ctx.out_dir)


def _train(ctx: StageContext, cfg: FinetuneConfig, best_dir: Path) -> tuple[dict, bool]:
    """Distillation's loop with the hard-label loss only, every epoch run; the epoch with the best
    eval accuracy is saved to ``best_dir``, outside the stage's temporary folder. Returns the metrics
    and whether this is the main process (the only one that writes files in a data-parallel run)."""
    import torch
    from accelerate import Accelerator

    from compress.models import count_parameters, load_classifier, save_checkpoint
    from compress.training import (
        BestKeeper,
        classification_metrics,
        encode,
        forward_inputs,
        optimizer_and_schedule,
        predict_logits,
        run_epoch,
        set_seed,
    )

    train, evals = ctx.split("train"), ctx.split("eval")
    set_seed(ctx.seed)
    teacher = ctx.recipe.teacher
    model, tokenizer = load_classifier(
        ctx.teacher_dir,
        num_labels=len(train.label_names),
        label_names=train.label_names,
        **teacher.load_options(),
    )
    max_length = ctx.recipe.task.max_length
    train_enc, eval_enc = encode(tokenizer, train, max_length), encode(tokenizer, evals, max_length)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    loader = torch.utils.data.DataLoader(
        train_enc, batch_size=cfg.batch_size, shuffle=True, generator=torch.Generator().manual_seed(ctx.seed)
    )
    optimizer, schedule = optimizer_and_schedule(
        model,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        warmup_ratio=cfg.warmup_ratio,
        total_steps=cfg.epochs * len(loader),
    )
    model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, loader, schedule)
    unwrapped = accelerator.unwrap_model(model)
    # the weights are read back from best_dir, so no copy is kept in memory (it would double the teacher's)
    best = BestKeeper(
        unwrapped,
        best_dir,
        lambda folder: save_checkpoint(unwrapped, tokenizer, folder),
        writer=accelerator.is_main_process,
        stage="finetune",
        in_memory=False,
    )

    def loss(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # the wrapped model computes (data-parallel gradients); the unwrapped one has the config
        return {"total": model(**forward_inputs(unwrapped, batch), labels=batch["labels"]).loss}

    start, history = time.time(), []
    for epoch in range(cfg.epochs):
        means = run_epoch(
            model,
            loader,
            accelerator,
            optimizer,
            schedule,
            loss=loss,
            check=best.check,
            max_grad_norm=cfg.max_grad_norm,
            label=f"finetune epoch {epoch + 1}/{cfg.epochs}",
        )
        metrics = classification_metrics(predict_logits(unwrapped, eval_enc), evals.labels)
        history.append({"epoch": epoch + 1, "train_loss": means["total"], **metrics})
        log.info(
            "finetune epoch %d: loss %.4f eval accuracy %.4f",
            epoch + 1,
            history[-1]["train_loss"],
            metrics["accuracy"],
        )
        best.offer(metrics["accuracy"])
    accelerator.wait_for_everyone()
    metrics = {
        "eval_accuracy": best.score,
        "best_epoch": max(history, key=lambda h: h["accuracy"])["epoch"],
        "history": history,
        "parameters": count_parameters(unwrapped),
        "train_seconds": round(time.time() - start, 2),
    }
    return metrics, accelerator.is_main_process


@register_stage("finetune", FinetuneConfig, sets_teacher=True)
def run(ctx: StageContext) -> StageResult:
    from compress.models import is_classifier

    cfg: FinetuneConfig = ctx.config  # type: ignore[assignment]
    train = ctx.split("train")
    if train.labels is None:
        raise DataError(f"{train.source}: finetune needs a label column in the training data")
    if cfg.when == "untrained" and is_classifier(ctx.teacher_dir, len(train.label_names)):
        _copy_teacher(ctx)
        return StageResult(info={"skipped": "the teacher is already a classifier for the task's labels"})
    best_dir = ctx.cache_dir / "finetune" / f"best-{ctx.index:02d}"
    metrics, is_main_process = _train(ctx, cfg, best_dir)
    if is_main_process:
        _copy_files(best_dir, ctx.out_dir)
    return StageResult(metrics=metrics)
