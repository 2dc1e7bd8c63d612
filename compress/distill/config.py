"""Options of the distillation loop, shared by the ``distill`` stage and any stage that reuses the loop."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from compress.config import Strict


class LossWeights(Strict):
    """Weight of each loss term; a term with weight 0 is not computed (nor cached for)."""

    soft: float = Field(1.0, ge=0)
    hard: float = Field(0.0, ge=0)
    hidden: float = Field(0.0, ge=0)
    attention: float = Field(0.0, ge=0)
    mlm: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _something_to_learn(self) -> LossWeights:
        if not any(getattr(self, k) > 0 for k in type(self).model_fields):
            raise ValueError(
                "every loss weight is 0; give at least one of soft, hard, hidden, attention, mlm > 0"
            )
        return self


class HiddenOptions(Strict):
    layer_map: list[tuple[int, int]] | None = None
    """Pairs [student, teacher] of hidden-state indices: 0 = embeddings, 1..L = output of layer L.
    Default: uniform, student m <-> teacher m * L_teacher / L_student (last aligns with last)."""
    metric: Literal["cosine", "mse"] = "cosine"
    include_embeddings: bool = False


class MlmOptions(Strict):
    rate: float = Field(0.15, gt=0, lt=1)
    replace_rule: tuple[float, float, float] | None = None
    """Shares of chosen tokens replaced by [MASK], by a random token, or kept. Default [0.8, 0.1, 0.1];
    whole-word masking only supports [1, 0, 0] (transformers' collator)."""
    dynamic: bool = True
    """New masked positions every time a row is seen (RoBERTa) instead of one fixed mask (BERT)."""
    whole_word: bool = False

    @model_validator(mode="after")
    def _rule(self) -> MlmOptions:
        if self.replace_rule is not None:
            if any(v < 0 for v in self.replace_rule) or abs(sum(self.replace_rule) - 1) > 1e-6:
                raise ValueError(
                    f"replace_rule {list(self.replace_rule)} must be 3 shares >= 0 that sum to 1"
                )
            if self.whole_word and self.replace_rule[0] != 1:
                raise ValueError(
                    "whole_word masking replaces every chosen token with [MASK]; "
                    "set replace_rule: [1.0, 0.0, 0.0] or drop it"
                )
        return self

    def rule(self) -> tuple[float, float, float]:
        if self.replace_rule is not None:
            return self.replace_rule
        return (1.0, 0.0, 0.0) if self.whole_word else (0.8, 0.1, 0.1)


class ProposerOptions(Strict):
    """A masked-LM proposer fitted on the teacher's own encoder over the task's text (``method: mlm``
    without ``mlm_model``): the teacher is a classifier and ships no MLM head, and none can be downloaded."""

    epochs: int = Field(3, gt=0)
    batch_size: int = Field(32, gt=0)
    lr: float = Field(1e-3, gt=0)
    train_layers: int = Field(1, ge=0)
    """Top encoder layers trained with the head (on a copy; the teacher is never changed). The
    teacher's last layers are tuned to its task, so a head alone predicts words poorly."""
    masking: MlmOptions = Field(default_factory=lambda: MlmOptions(whole_word=True))
    """Dynamic, whole-word masking by default (RoBERTa, BERT-wwm)."""
    holdout: float = Field(0.05, ge=0, lt=0.5)
    """Share of the texts held out to report the proposer's masked-token accuracy."""


class AugmentOptions(Strict):
    """TinyBERT-style augmentation: each row gets ``multiplier`` variants with some words replaced."""

    multiplier: int = Field(4, ge=1)
    method: Literal["embedding", "mlm"] = "embedding"
    mlm_model: str | None = None
    """A masked-LM folder sharing the teacher's vocabulary (method: mlm); unset: fit one on the
    teacher's encoder (``proposer``)."""
    proposer: ProposerOptions = Field(default_factory=ProposerOptions)
    candidates: int = Field(15, ge=1)
    replace_prob: float = Field(0.4, gt=0, le=1)


class UnlabelledData(Strict):
    """Extra text for the transfer set; the teacher labels it (soft/hidden/attention/mlm terms only)."""

    path: str
    text: str = "text"
    text_pair: str | None = None


class DistillOptions(Strict):
    epochs: int = Field(3, gt=0)
    batch_size: int = Field(32, gt=0)
    eval_batch_size: int = Field(64, gt=0)
    group_by_length: bool = True
    """Batch rows of similar length together (less padding, faster); false = plain shuffling."""
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    max_grad_norm: float | None = Field(1.0, gt=0)
    patience: int | None = Field(2, gt=0)
    """Epochs without a better eval score before stopping; null = run every epoch."""
    temperature: float = Field(2.0, gt=0)
    max_length: int | None = Field(None, gt=0)
    """Default: the recipe's task.max_length."""
    weights: LossWeights = Field(default_factory=LossWeights)
    hidden: HiddenOptions = Field(default_factory=HiddenOptions)
    mlm: MlmOptions = Field(default_factory=MlmOptions)
    augment: AugmentOptions | None = None
    unlabelled: UnlabelledData | None = None
