"""One epoch of distillation, the data it draws, and keeping the best epoch's weights.

Every rank runs the same code on its shard; the loss is reduced across ranks before the
finiteness check so all ranks stop together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from compress.distill.config import INTERMEDIATE_TERMS, DistillOptions
from compress.distill.data import TransferData
from compress.distill.losses import Masker
from compress.distill.objective import DistillModule, Phase
from compress.errors import TrainingError
from compress.io import atomic_dir
from compress.models import save_checkpoint
from compress.terminal import progress
from compress.training import check_finite, classification_metrics, optimizer_and_schedule, predict_logits


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


def mlm_batch(masker: Masker | None, data: TransferData, static: Any, batch: dict[str, torch.Tensor]) -> Any:
    if masker is None:
        return None
    if static is not None:
        index = batch["index"].cpu()
        return static[0][index].to(batch["input_ids"].device), static[1][index].to(batch["input_ids"].device)
    offsets = data.offsets[batch["index"].cpu()] if data.offsets is not None else None
    masked, labels = masker(batch["input_ids"].cpu(), offsets)
    return masked.to(batch["input_ids"].device), labels.to(batch["input_ids"].device)


class BestKeeper:
    """Keeps the best epoch's weights in memory and (main process only) as a checkpoint on disk,
    so a run that later fails still leaves its last good student behind."""

    def __init__(self, student: Any, tokenizer: Any, folder: Path, writer: bool):
        self.student, self.tokenizer, self.folder, self.writer = student, tokenizer, folder, writer
        self.score: float | None = None
        self.state: dict[str, torch.Tensor] | None = None
        self.waited = 0
        self.step = 0

    def restart(self) -> None:
        """Choose among the epochs from here on only (their scores are not comparable with earlier ones)."""
        self.score, self.waited = None, 0

    def offer(self, score: float) -> bool:
        """Record an epoch's eval score; True when it is the best so far."""
        if self.score is not None and score <= self.score:
            self.waited += 1
            return False
        self.score, self.waited = score, 0
        self.state = {k: v.detach().clone() for k, v in self.student.state_dict().items()}
        if self.writer:
            with atomic_dir(self.folder) as tmp:
                save_checkpoint(self.student, self.tokenizer, tmp)
        return True

    def check(self, total: torch.Tensor) -> None:
        """Stop on a non-finite loss, naming the step and where the last good checkpoint is."""
        try:
            check_finite(total, self.step, "distill")
        except TrainingError as exc:
            where = f"last good checkpoint: {self.folder}" if self.state is not None else "no checkpoint yet"
            raise TrainingError(f"{exc}; {where}") from None
        self.step += 1


@dataclass
class Loop:
    model: Any
    """The (possibly DDP-wrapped) ``DistillModule``."""
    loader: Any
    accelerator: Any
    data: TransferData
    options: DistillOptions
    best: BestKeeper
    masking: Callable[[dict[str, torch.Tensor]], Any]
    """batch -> (masked ids, MLM labels) or None."""
    optimizer: Any = None
    schedule: Any = None
    layers: bool = True
    """Whether the terms being trained read the teacher's hidden states or attention maps."""

    def start(self, module: DistillModule, phase: Phase) -> None:
        """Train ``phase``'s terms from here on, with a fresh optimiser and a warm-up/decay schedule
        over the phase's own steps (TinyBERT's two steps are two trainings in a row)."""
        if self.optimizer is not None:  # the previous step's moments (accelerate keeps its optimisers)
            self.optimizer.state.clear()
        module.active = phase.terms
        self.layers = any(term in INTERMEDIATE_TERMS for term in phase.terms)
        optimizer, self.schedule = optimizer_and_schedule(
            module,
            lr=phase.lr or self.options.lr,
            weight_decay=self.options.weight_decay,
            warmup_ratio=self.options.warmup_ratio,
            total_steps=phase.epochs * len(self.loader),
        )
        self.optimizer = self.accelerator.prepare(optimizer)

    def epoch(self, label: str) -> dict[str, float]:
        """One pass over the transfer set; each loss term's mean (averaged over processes)."""
        acc = self.accelerator
        self.model.train()
        sums: dict[str, torch.Tensor] = {}
        bar = progress(self.loader, desc=label, disable=not acc.is_main_process, leave=False)
        for batch in bar:
            length = int(batch["attention_mask"].sum(dim=1).max())
            target = to_device(self.data.targets.batch(batch["index"], length, self.layers), acc.device)
            terms = self.model(batch, target, self.masking(batch))
            total = acc.reduce(terms["total"].detach().clone(), "mean")
            self.best.check(total)
            acc.backward(terms["total"])
            if self.options.max_grad_norm is not None:
                acc.clip_grad_norm_(self.model.parameters(), self.options.max_grad_norm)
            self.optimizer.step()
            self.schedule.step()
            self.optimizer.zero_grad()
            for name, value in terms.items():
                sums[name] = sums.get(name, torch.zeros(())) + value.detach().float().cpu()
            bar.set_postfix(loss=f"{total.item():.4f}")
        return {
            name: float(acc.reduce((v / len(self.loader)).to(acc.device), "mean")) for name, v in sums.items()
        }


def to_device(target: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {
        "logits": target["logits"].to(device),
        "hidden": {k: v.to(device) for k, v in target["hidden"].items()},
        "attentions": {k: v.to(device) for k, v in target["attentions"].items()},
    }
