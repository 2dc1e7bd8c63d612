"""The distillation loss terms (DistilBERT, TinyBERT) and the masked-LM objective.

Every term is a pure function of tensors so it can be checked by hand on tiny inputs. Token-level
terms average over real tokens only: padding must not pull a student toward anything.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from compress.distill.config import MlmOptions

IGNORE = -100


def soft_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher || student) on temperature-softened distributions, times T^2 so gradients keep
    their size as T changes (Hinton et al.)."""
    t = temperature
    student = F.log_softmax(student_logits / t, dim=-1)
    teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)
    return F.kl_div(student, teacher, reduction="batchmean", log_target=True) * (t * t)


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
