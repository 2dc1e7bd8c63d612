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
from tqdm.auto import tqdm

from compress.distill.config import DistillOptions
from compress.distill.data import TransferData, prepare_transfer
from compress.distill.losses import Masker
from compress.distill.objective import DistillModule
from compress.errors import TrainingError
from compress.io import atomic_dir
from compress.models import save_checkpoint
from compress.stages.base import StageContext
from compress.training import (
    check_finite,
    classification_metrics,
    optimizer_and_schedule,
    predict_logits,
    set_seed,
)

log = logging.getLogger(__name__)


@dataclass
class DistillOutcome:
    metrics: dict[str, Any]
    info: dict[str, Any]
    is_main_process: bool


def evaluate(student: Any, data: TransferData, batch_size: int) -> dict[str, float]:
    logits = predict_logits(student, data.eval_enc, batch_size)
    return classification_metrics(logits, data.eval_labels, reference=data.eval_teacher_logits)


def train_loader(data: TransferData, options: DistillOptions, seed: int) -> torch.utils.data.DataLoader:
    """Shuffled batches; with ``group_by_length`` rows of similar length share a batch (transformers'
    ``LengthGroupedSampler``), which cuts the padding a batch computes on, often by half."""
    generator = torch.Generator().manual_seed(seed)
    if not options.group_by_length:
        return torch.utils.data.DataLoader(
            data.train_enc, batch_size=options.batch_size, shuffle=True, generator=generator
        )
    from transformers.trainer_pt_utils import LengthGroupedSampler

    lengths = data.train_enc.attention_mask.sum(dim=1).tolist()
    sampler = LengthGroupedSampler(options.batch_size, lengths=lengths, generator=generator)
    return torch.utils.data.DataLoader(data.train_enc, batch_size=options.batch_size, sampler=sampler)


def _mlm_batch(masker: Masker | None, data: TransferData, static: Any, batch: dict[str, torch.Tensor]) -> Any:
    if masker is None:
        return None
    if static is not None:
        index = batch["index"].cpu()
        return static[0][index].to(batch["input_ids"].device), static[1][index].to(batch["input_ids"].device)
    offsets = data.offsets[batch["index"].cpu()] if data.offsets is not None else None
    masked, labels = masker(batch["input_ids"].cpu(), offsets)
    return masked.to(batch["input_ids"].device), labels.to(batch["input_ids"].device)


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
    curves: dict[str, list[float]] = {}
    history: list[dict[str, float]] = []
    best, best_state, waited, step, saved = None, None, 0, 0, False
    for epoch in range(1, options.epochs + 1):
        model.train()
        sums: dict[str, torch.Tensor] = {}
        bar = tqdm(
            loader,
            desc=f"distill {epoch}/{options.epochs}",
            disable=not accelerator.is_main_process,
            leave=False,
        )
        for batch in bar:
            length = int(batch["attention_mask"].sum(dim=1).max())
            target = data.targets.batch(batch["index"], length)
            target = _to(target, accelerator.device)
            terms = model(batch, target, _mlm_batch(masker, data, static, batch))
            total = accelerator.reduce(terms["total"].detach().clone(), "mean")
            try:
                check_finite(total, step, "distill")
            except TrainingError as exc:
                where = f"last good checkpoint: {checkpoint_dir}" if saved else "no checkpoint was saved yet"
                raise TrainingError(f"{exc}; {where}") from None
            accelerator.backward(terms["total"])
            if options.max_grad_norm is not None:
                accelerator.clip_grad_norm_(model.parameters(), options.max_grad_norm)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            step += 1
            for name, value in terms.items():
                sums[name] = sums.get(name, torch.zeros(())) + value.detach().float().cpu()
            bar.set_postfix(loss=f"{total.item():.4f}", eval=f"{history[-1][key]:.4f}" if history else "-")
        for name, value in sums.items():
            mean = accelerator.reduce((value / len(loader)).to(accelerator.device), "mean")
            curves.setdefault(name, []).append(round(float(mean), 6))
        scores = evaluate(student, data, options.eval_batch_size)
        history.append({"epoch": epoch, **scores})
        log.info("distill epoch %d: loss %.4f eval %s", epoch, curves["total"][-1], scores)
        score = scores[key]
        if best is None or score > best:
            best, waited = score, 0
            best_state = {k: v.detach().clone() for k, v in student.state_dict().items()}
            if accelerator.is_main_process:
                with atomic_dir(checkpoint_dir) as tmp:
                    save_checkpoint(student, tokenizer, tmp)
            saved = True
        else:
            waited += 1
            if options.patience is not None and waited >= options.patience:
                break
    student.load_state_dict(best_state)
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


def _to(target: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {
        "logits": target["logits"].to(device),
        "hidden": {k: v.to(device) for k, v in target["hidden"].items()},
        "attentions": {k: v.to(device) for k, v in target["attentions"].items()},
    }
