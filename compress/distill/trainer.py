"""The distillation loop on Hugging Face Accelerate: one process by default, data-parallel under
``accelerate launch`` / ``torchrun`` with no code change. Every rank computes the same decisions
(eval on the full eval set, losses reduced across ranks); only the main process writes files.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from compress.distill.config import DistillOptions
from compress.distill.data import prepare_transfer
from compress.distill.loop import BestKeeper, Loop, evaluate, mlm_batch, train_loader
from compress.distill.losses import Masker
from compress.distill.objective import DistillModule
from compress.stages.base import StageContext
from compress.training import optimizer_and_schedule, set_seed

log = logging.getLogger(__name__)


@dataclass
class DistillOutcome:
    metrics: dict[str, Any]
    info: dict[str, Any]
    is_main_process: bool


def distill_model(
    student: Any,
    tokenizer: Any,
    teacher_dir: Path,
    ctx: StageContext,
    options: DistillOptions,
    *,
    checkpoint_dir: Path | None = None,
) -> DistillOutcome:
    """Train ``student`` in place against the teacher; the best eval epoch's weights are restored."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    set_seed(ctx.seed)
    start = time.time()
    checkpoint_dir = checkpoint_dir or ctx.cache_dir / "distill" / f"best-{ctx.index:02d}"
    data = prepare_transfer(student, tokenizer, teacher_dir, ctx, options, accelerator)
    pairs = data.pairs
    implementation = student.config._attn_implementation
    if options.weights.attention > 0:
        student.set_attn_implementation("eager")
    module = DistillModule(student, options, pairs, data.teacher_width)
    masker = (
        Masker(tokenizer, options.mlm, ctx.seed + accelerator.process_index)
        if options.weights.mlm > 0
        else None
    )
    static = (
        Masker(tokenizer, options.mlm, ctx.seed)(data.train_enc.input_ids, data.offsets)
        if (masker is not None and not options.mlm.dynamic)
        else None
    )
    loader = accelerator.prepare(train_loader(data, options, ctx.seed))
    optimizer, schedule = optimizer_and_schedule(
        module,
        lr=options.lr,
        weight_decay=options.weight_decay,
        warmup_ratio=options.warmup_ratio,
        total_steps=options.epochs * len(loader),
    )
    model, optimizer = accelerator.prepare(module, optimizer)

    key = "accuracy" if data.eval_labels is not None else "agreement"
    best = BestKeeper(student, tokenizer, checkpoint_dir, accelerator.is_main_process)
    loop = Loop(
        model,
        loader,
        optimizer,
        schedule,
        accelerator,
        data,
        options,
        best,
        lambda batch: mlm_batch(masker, data, static, batch),
    )
    curves: dict[str, list[float]] = {}
    history: list[dict[str, float]] = []
    for epoch in range(1, options.epochs + 1):
        label = f"distill {epoch}/{options.epochs}" + (f" (eval {history[-1][key]:.4f})" if history else "")
        means = loop.epoch(label)
        for name, value in means.items():
            curves.setdefault(name, []).append(round(value, 6))
        scores = evaluate(student, data, options.eval_batch_size)
        history.append({"epoch": epoch, **scores})
        shown = ", ".join(f"{name} {value:.4f}" for name, value in scores.items())
        log.info("distill epoch %d: loss %.4f eval %s", epoch, curves["total"][-1], shown)
        if best.offer(scores[key]):
            continue
        if options.patience is not None and best.waited >= options.patience:
            break
    student.load_state_dict(best.state)
    student.set_attn_implementation(implementation)
    accelerator.wait_for_everyone()
    best_epoch = max(history, key=lambda h: h[key])
    metrics = {
        "accuracy": best_epoch.get("accuracy"),
        "agreement": best_epoch["agreement"],
        "teacher_accuracy": data.teacher_accuracy,
        "best_epoch": best_epoch["epoch"],
        "epochs_run": len(history),
        "loss_curves": curves,
        "eval_curve": history,
        "train_rows": len(data.train_enc),
        "processes": accelerator.num_processes,
        "train_seconds": round(time.time() - start, 2),
    }
    info = {"layer_map": [list(p) for p in pairs], **data.info}
    return DistillOutcome(metrics, info, accelerator.is_main_process)
