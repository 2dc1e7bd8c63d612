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
    relation: float = Field(0.0, ge=0)
    """MiniLM's self-attention relations (``relation`` options)."""
    mlm: float = Field(0.0, ge=0)
    rtd: float = Field(0.0, ge=0)
    """ELECTRA's replaced-token detection (``rtd`` options): a second pass over each batch with some words
    swapped, the student telling which tokens were replaced."""

    @model_validator(mode="after")
    def _something_to_learn(self) -> LossWeights:
        if not any(getattr(self, k) > 0 for k in type(self).model_fields):
            raise ValueError(
                "every loss weight is 0; give at least one of "
                "soft, hard, hidden, attention, relation, mlm, rtd > 0"
            )
        return self


INTERMEDIATE_TERMS = ("hidden", "attention", "relation")
"""Terms on the student's inner layers: TinyBERT's first step when ``intermediate_epochs`` > 0."""
PREDICTION_TERMS = ("soft", "hard", "mlm", "rtd")
"""Terms on the student's outputs: TinyBERT's second step."""


class HiddenOptions(Strict):
    layer_map: list[tuple[int, int]] | None = None
    """Pairs [student, teacher] of hidden-state indices: 0 = embeddings, 1..L = output of layer L.
    Default: uniform, student m <-> teacher m * L_teacher / L_student (last aligns with last)."""
    metric: Literal["cosine", "mse"] = "cosine"
    include_embeddings: bool = False


class RelationOptions(Strict):
    """MiniLM's self-attention relation transfer (Wang et al. 2020, 2021): for one teacher layer and one
    student layer, the scaled dot products of the queries with the queries (and keys with keys, values
    with values), softmaxed over the real tokens, become distributions the student matches by KL. The
    relations are token x token, so the student's width and head count need not match the teacher's."""

    teacher_layer: int | None = None
    """Teacher layer (1 = the first; -1 or null = the last)."""
    student_layer: int | None = None
    """Student layer (1 = the first; -1 or null = the last)."""
    relation_heads: int | None = Field(None, gt=0)
    """Heads the query/key/value vectors are split into (MiniLMv2: may differ from the models' attention
    heads); must divide both models' widths. Default: the teacher's attention heads."""
    relations: list[Literal["query", "key", "value"]] = Field(
        default_factory=lambda: ["query", "key", "value"], min_length=1
    )
    """Which self-relations to match: query-query, key-key, value-value (MiniLMv2 uses all three)."""

    @model_validator(mode="after")
    def _layers_and_relations(self) -> RelationOptions:
        for name in ("teacher_layer", "student_layer"):
            value = getattr(self, name)
            if value is not None and value < 1 and value != -1:
                raise ValueError(
                    f"{name}: {value} is not a layer; layers count from 1 (-1 or null = the last)"
                )
        if len(set(self.relations)) != len(self.relations):
            raise ValueError(f"relations: {self.relations} lists a relation twice; give each at most once")
        return self


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


class RtdOptions(Strict):
    """Which tokens replaced-token detection swaps: each alphabetic word-start token of a row (a whole word
    or the first piece of a split one), with probability ``rate``, for one of its ``candidates`` nearest
    whole-word neighbours in the student's word-embedding space."""

    rate: float = Field(0.15, gt=0, lt=1)
    candidates: int = Field(10, ge=1)


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

    multiplier: int = Field(4, ge=0)
    """Variants per row (0: none, for ``swap_pairs`` alone)."""
    method: Literal["embedding", "mlm", "spans", "pairs"] = "embedding"
    """embedding/mlm: words swapped for neighbours or a masked LM's guesses (``candidates``,
    ``replace_prob``); spans: contiguous phrases of each text's words, two words up to all but one;
    pairs (pair tasks): each first text with the ``multiplier`` second texts of other rows that share
    most of its words (TF-IDF cosine), new pairs of the task's own sentences."""
    mlm_model: str | None = None
    """A masked-LM folder sharing the teacher's vocabulary (method: mlm); unset: fit one on the
    teacher's encoder (``proposer``)."""
    proposer: ProposerOptions = Field(default_factory=ProposerOptions)
    candidates: int = Field(15, ge=1)
    replace_prob: float = Field(0.4, gt=0, le=1)
    swap_pairs: bool = False
    """Pair tasks: every pair (and every variant) also in the other order, second sentence first.
    The teacher labels the swapped rows like any other transfer row, so nothing assumes the task
    is symmetric; the student sees how the teacher reads both orders."""

    @model_validator(mode="after")
    def _adds_rows(self) -> AugmentOptions:
        if self.multiplier == 0 and not self.swap_pairs:
            raise ValueError(
                "augment adds no rows with multiplier: 0; set multiplier >= 1 or swap_pairs: true"
            )
        return self


class UnlabelledData(Strict):
    """Extra text for the transfer set; the teacher labels it (soft/hidden/attention/mlm terms only)."""

    path: str
    text: str = "text"
    text_pair: str | None = None


class QuantizationAwareOptions(Strict):
    """Quantization-aware recovery (``compress.distill.qat``): after the float epochs, ``epochs`` more in
    which every linear layer computes as dynamic int8 will (int8 weights per output channel, uint8
    activations per sentence), starting from the best float epoch, with a fresh warm-up/decay schedule.
    The best of these epochs, scored on the held-out eval rows as int8 computes them, is kept."""

    epochs: int = Field(1, gt=0)
    lr: float | None = Field(None, gt=0)
    """Peak learning rate of these epochs (default: the loop's ``lr``)."""


class DistillOptions(Strict):
    epochs: int = Field(3, gt=0)
    intermediate_epochs: int = Field(0, ge=0)
    """TinyBERT's two steps: the first N epochs train only the intermediate terms (hidden, attention,
    relation), the remaining ``epochs - N`` only the prediction terms (soft, hard, mlm, rtd), each step with
    its own optimiser and warm-up/decay schedule. The best epoch and patience count in the second step
    only. 0 = every term from the first epoch."""
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
    relation: RelationOptions = Field(default_factory=RelationOptions)
    mlm: MlmOptions = Field(default_factory=MlmOptions)
    rtd: RtdOptions = Field(default_factory=RtdOptions)
    augment: AugmentOptions | None = None
    unlabelled: UnlabelledData | None = None
    quantization_aware: QuantizationAwareOptions | None = None
    """Extra epochs that train the student as int8 computes it (off by default)."""

    @model_validator(mode="after")
    def _two_steps(self) -> DistillOptions:
        n = self.intermediate_epochs
        if n == 0:
            return self
        if n >= self.epochs:
            raise ValueError(
                f"intermediate_epochs: {n} leaves no epoch for the prediction terms; "
                f"set it below epochs ({self.epochs}) or raise epochs"
            )
        if not any(getattr(self.weights, k) > 0 for k in INTERMEDIATE_TERMS):
            raise ValueError(
                f"intermediate_epochs: {n} epochs would train only hidden, attention and relation, but "
                "their weights are all 0; give weights.relation (or hidden, attention) > 0, "
                "or set intermediate_epochs: 0"
            )
        if not any(getattr(self.weights, k) > 0 for k in PREDICTION_TERMS):
            raise ValueError(
                "intermediate_epochs: the epochs after them train only soft, hard, mlm and rtd, but their "
                "weights are all 0; give weights.soft (or hard, mlm, rtd) > 0, or set intermediate_epochs: 0"
            )
        return self
