"""The student plus everything trained with it (projection, MLM head) as one module that returns
its weighted loss terms, so data-parallel training syncs every trainable tensor in one place."""

from __future__ import annotations

from typing import Any

import torch

from compress.distill.config import DistillOptions
from compress.distill.losses import attention_mse, hard_ce, hidden_alignment, mlm_loss, mlm_model, soft_kl
from compress.errors import RecipeError
from compress.training import forward_inputs


def layer_map(options: DistillOptions, student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """Hidden-state pairs (student, teacher); 0 is the embeddings output, L the last layer."""
    if options.hidden.layer_map is not None:
        pairs = [tuple(p) for p in options.hidden.layer_map]
        for s, t in pairs:
            if not (0 <= s <= student_layers and 0 <= t <= teacher_layers):
                raise RecipeError(
                    f"hidden.layer_map: pair [{s}, {t}] is out of range; student indices are "
                    f"0..{student_layers}, teacher indices 0..{teacher_layers} (0 = embeddings)"
                )
    else:
        pairs = [(m, round(m * teacher_layers / student_layers)) for m in range(1, student_layers + 1)]
    if options.hidden.include_embeddings and (0, 0) not in pairs:
        pairs = [(0, 0), *pairs]
    return pairs


class DistillModule(torch.nn.Module):
    """Student + optional projection (TinyBERT W_h) + optional MLM head sharing the student's encoder."""

    def __init__(
        self, student: Any, options: DistillOptions, pairs: list[tuple[int, int]], teacher_width: int
    ):
        super().__init__()
        self.student = student
        self.options = options
        self.pairs = pairs
        self.attention_pairs = [(s, t) for s, t in pairs if s > 0 and t > 0]
        width = student.config.hidden_size
        needs_projection = options.weights.hidden > 0 and width != teacher_width
        self.projection = torch.nn.Linear(width, teacher_width) if needs_projection else None
        self.mlm = mlm_model(student) if options.weights.mlm > 0 else None

    def forward(
        self,
        batch: dict[str, torch.Tensor],
        target: dict[str, Any],
        mlm_batch: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> dict[str, torch.Tensor]:
        """Each loss term with a non-zero weight, unweighted; ``total`` is the weighted sum."""
        w, inputs = self.options.weights, forward_inputs(self.student, batch)
        mask = inputs["attention_mask"]
        out = self.student(**inputs, output_hidden_states=w.hidden > 0, output_attentions=w.attention > 0)
        terms: dict[str, torch.Tensor] = {}
        if w.soft > 0:
            terms["soft"] = soft_kl(out.logits, target["logits"], self.options.temperature)
        if w.hard > 0:
            terms["hard"] = hard_ce(out.logits, batch["labels"])
        if w.hidden > 0:
            student_states = {s: out.hidden_states[s] for s, _ in self.pairs}
            terms["hidden"] = hidden_alignment(
                student_states,
                target["hidden"],
                self.pairs,
                mask,
                self.options.hidden.metric,
                self.projection,
            )
        if w.attention > 0:
            student_maps = {s: out.attentions[s - 1] for s, _ in self.attention_pairs}
            terms["attention"] = attention_mse(student_maps, target["attentions"], self.attention_pairs, mask)
        if w.mlm > 0 and mlm_batch is not None:
            masked, labels = mlm_batch
            length = masked.shape[1]
            mlm_inputs = {**inputs, "input_ids": masked[:, : inputs["input_ids"].shape[1]]}
            terms["mlm"] = mlm_loss(self.mlm(**mlm_inputs).logits, labels[:, : min(length, mask.shape[1])])
        terms["total"] = sum(getattr(w, name) * value for name, value in terms.items())
        return terms
