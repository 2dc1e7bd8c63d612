"""One epoch of distillation and the data it draws.

The epoch itself is ``compress.training.run_epoch``, the loop fine-tuning runs too; what is
distillation's own is the batch's loss (the teacher's targets for the batch, the MLM masking, the
replaced tokens) and
the optimiser a training step starts afresh.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from compress.distill.config import INTERMEDIATE_TERMS, DistillOptions
from compress.distill.data import TransferData
from compress.distill.losses import Masker
from compress.distill.objective import DistillModule, Phase
from compress.distill.rtd import Replacer
from compress.training import (
    BestKeeper,
    classification_metrics,
    optimizer_and_schedule,
    predict_logits,
    run_epoch,
)


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


def rtd_batch(replacer: Replacer | None, batch: dict[str, torch.Tensor]) -> Any:
    if replacer is None:
        return None
    return replacer(batch["input_ids"], batch["attention_mask"])


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
    replacing: Callable[[dict[str, torch.Tensor]], Any] = lambda batch: None
    """batch -> (ids with replaced words, replaced-token labels) or None."""
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
        device = self.accelerator.device

        def terms(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            length = int(batch["attention_mask"].sum(dim=1).max())
            target = to_device(self.data.targets.batch(batch["index"], length, self.layers), device)
            return self.model(batch, target, self.masking(batch), self.replacing(batch))

        return run_epoch(
            self.model,
            self.loader,
            self.accelerator,
            self.optimizer,
            self.schedule,
            loss=terms,
            check=self.best.check,
            max_grad_norm=self.options.max_grad_norm,
            label=label,
        )


def to_device(target: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {
        "logits": target["logits"].to(device),
        "hidden": {k: v.to(device) for k, v in target["hidden"].items()},
        "attentions": {k: v.to(device) for k, v in target["attentions"].items()},
    }
