"""The distillation loss terms (DistilBERT, TinyBERT, MiniLM) and the masked-LM objective.

Every term is a pure function of tensors so it can be checked by hand on tiny inputs. Token-level
terms average over real tokens only: padding must not pull a student toward anything.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from compress.distill.config import MlmOptions
from compress.training import mean_kl

IGNORE = -100


def soft_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher || student) on temperature-softened distributions, times T^2 so gradients keep
    their size as T changes (Hinton et al.)."""
    t = temperature
    return mean_kl(student_logits / t, teacher_logits.float() / t) * (t * t)


def hard_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with the gold labels; rows labelled -100 (unlabelled or augmented) are skipped."""
    if not (labels != IGNORE).any():
        return logits.sum() * 0.0
    return F.cross_entropy(logits, labels, ignore_index=IGNORE)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def hidden_alignment(
    student: dict[int, torch.Tensor],
    teacher: dict[int, torch.Tensor],
    layer_map: list[tuple[int, int]],
    attention_mask: torch.Tensor,
    metric: str,
    projection: torch.nn.Module | None = None,
) -> torch.Tensor:
    """Mean over the mapped pairs of (1 - cosine) or MSE between hidden states at real tokens.

    ``projection`` maps student width to teacher width when they differ (TinyBERT's W_h).
    """
    mask = attention_mask.bool()
    losses = []
    for s, t in layer_map:
        hs = student[s] if projection is None else projection(student[s])
        ht = teacher[t].to(hs.dtype)
        if metric == "cosine":
            per_token = 1.0 - F.cosine_similarity(hs, ht, dim=-1)
        else:
            per_token = ((hs - ht) ** 2).mean(dim=-1)
        losses.append(_masked_mean(per_token, mask))
    return torch.stack(losses).mean()


def attention_mse(
    student: dict[int, torch.Tensor],
    teacher: dict[int, torch.Tensor],
    layer_map: list[tuple[int, int]],
    attention_mask: torch.Tensor,
) -> torch.Tensor:
    """MSE between attention maps (B, heads, T, T) over real query/key pairs, mean over mapped layers."""
    real = attention_mask.bool()
    pairs = (real[:, None, :, None] & real[:, None, None, :]).to(torch.float32)
    losses = []
    for s, t in layer_map:
        a_s = student[s]
        diff = (a_s - teacher[t].to(a_s.dtype)) ** 2
        mask = pairs.expand_as(diff)
        losses.append((diff * mask).sum() / mask.sum().clamp(min=1))
    return torch.stack(losses).mean()


def log_self_relation(x: torch.Tensor, heads: int, real: torch.Tensor) -> torch.Tensor:
    """log softmax(X_h X_hᵀ / sqrt(d_h)) over the real keys, per head: (B, T, W) -> (B, heads, T, T).

    Padded keys get the dtype's lowest value rather than -inf, so that padded query rows (no real key)
    stay finite and cannot send NaN gradients back through the softmax.
    """
    b, t, width = x.shape
    d = width // heads
    x = x.float().reshape(b, t, heads, d).transpose(1, 2)
    scores = x @ x.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(~real[:, None, None, :], torch.finfo(scores.dtype).min)
    return F.log_softmax(scores, dim=-1)


def relation_kl(
    student: dict[str, torch.Tensor],
    teacher: dict[str, torch.Tensor],
    attention_mask: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """MiniLM(v2)'s self-attention relation transfer: KL(teacher relation || student relation).

    ``student`` / ``teacher`` map a relation name (query, key, value) to that layer's projections
    (B, T, width); the two widths may differ, each is split into ``heads`` relation heads. The KL of each
    real query row is summed over the real keys, then averaged over heads, real rows and relations.
    """
    real = attention_mask.bool()
    losses = []
    for name, s in student.items():
        log_s = log_self_relation(s, heads, real)
        log_t = log_self_relation(teacher[name], heads, real)
        kl = (log_t.exp() * (log_t - log_s)).masked_fill(~real[:, None, None, :], 0.0).sum(-1)
        losses.append(_masked_mean(kl.mean(dim=1), real))
    return torch.stack(losses).mean()


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the masked positions only (labels -100 elsewhere)."""
    if not (labels != IGNORE).any():
        return logits.sum() * 0.0
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


class Masker:
    """Chooses masked positions with transformers' ``DataCollatorForLanguageModeling``.

    Dynamic masking draws new positions each call; static masking draws once per row (seeded by
    the caller masking the whole set once) so every epoch sees the same mask.
    """

    def __init__(self, tokenizer: Any, options: MlmOptions, seed: int):
        from transformers import DataCollatorForLanguageModeling

        mask, random, _ = options.rule()
        self.collator = DataCollatorForLanguageModeling(
            tokenizer,
            mlm_probability=options.rate,
            whole_word_mask=options.whole_word,
            mask_replace_prob=mask,
            random_replace_prob=random,
            seed=seed,
        )
        self.collator.create_rng("pt")
        self.special = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)

    def __call__(
        self, input_ids: torch.Tensor, offsets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(masked input_ids, labels with -100 at unmasked positions)."""
        special = torch.isin(input_ids, self.special).long()
        offsets = offsets if self.collator.whole_word_mask else None
        return self.collator.torch_mask_tokens(
            input_ids.clone(), special_tokens_mask=special, offset_mapping=offsets
        )


def mlm_model(student: Any) -> Any:
    """A masked-LM model that shares the student's encoder (and its word embeddings via tying).

    Its head starts random: the teacher is a classifier and has no MLM head to copy.
    """
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_config(student.config)
    setattr(model, model.base_model_prefix, student.base_model)
    model.tie_weights()
    return model
