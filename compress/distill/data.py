"""Everything the loop trains on: the transfer set (train + unlabelled + augmented rows), its
encodings for student and teacher, the cached teacher targets and the eval set.

The teacher and student may tokenise differently (e.g. a student with a pruned vocabulary), so
each side gets its own encoding; token-level losses then need both to split text identically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from compress.data import Split, load_file
from compress.distill.augment import augment_split
from compress.distill.config import DistillOptions
from compress.distill.objective import RelationLayers, frozen_projections, layer_map, relation_layers
from compress.distill.transfer import TeacherOutputs, combine, real_lengths, teacher_outputs
from compress.errors import DataError
from compress.models import folder_weights_sha, load_classifier
from compress.recipe_base import resolve_path
from compress.stage_context import StageContext
from compress.training import Encoded, classification_metrics, encode


@dataclass
class TransferData:
    train_enc: Encoded
    targets: TeacherOutputs
    offsets: torch.Tensor | None
    """Character offsets of ``train_enc`` tokens, for whole-word masking."""
    eval_enc: Encoded
    eval_labels: list[int] | None
    eval_teacher_logits: torch.Tensor
    teacher_accuracy: float | None
    teacher_width: int
    pairs: list[tuple[int, int]]
    relation: tuple[RelationLayers, torch.nn.ModuleDict] | None = None
    """With ``weights.relation`` > 0: the resolved layers and the teacher layer's frozen projections,
    applied to its cached input (hidden state ``teacher - 1``)."""
    info: dict[str, Any] = field(default_factory=dict)


def transfer_split(
    ctx: StageContext, options: DistillOptions, teacher: Any, tokenizer: Any, teacher_sha: str
) -> Split:
    train = ctx.split("train")
    parts = [train]
    if options.unlabelled is not None:
        extra = options.unlabelled
        parts.append(
            load_file(
                resolve_path(ctx.recipe, extra.path),
                text=extra.text,
                text_pair=extra.text_pair,
                label=None,
                label_names=train.label_names,
            )
        )
    base = combine(parts) if len(parts) > 1 else train
    if options.augment is None:
        return base
    augment = options.augment
    if augment.mlm_model:
        augment = augment.model_copy(update={"mlm_model": str(resolve_path(ctx.recipe, augment.mlm_model))})
    extra_rows = augment_split(
        base, tokenizer, teacher, augment, seed=ctx.seed, cache_dir=ctx.cache_dir, teacher_sha=teacher_sha
    )
    return combine([base, extra_rows])


def student_encoding(
    tokenizer: Any, teacher_tok: Any, split: Split, teacher_enc: Encoded, max_length: int, token_level: bool
) -> Encoded:
    if tokenizer.get_vocab() == teacher_tok.get_vocab():
        return teacher_enc
    enc = encode(tokenizer, split, max_length)
    if token_level and not torch.equal(
        real_lengths(enc.attention_mask), real_lengths(teacher_enc.attention_mask)
    ):
        raise DataError(
            "distill: the student's tokenizer splits text differently from the teacher's; "
            "hidden, attention and relation losses need the same tokens (set their weights to 0)"
        )
    return enc


def prepare_transfer(
    student: Any,
    tokenizer: Any,
    teacher_dir: Any,
    ctx: StageContext,
    options: DistillOptions,
    accelerator: Any,
) -> TransferData:
    """Load the teacher, build the transfer set and fill the teacher-output cache (main process first)."""
    recipe, weights = ctx.recipe, options.weights
    teacher, teacher_tok = load_classifier(
        teacher_dir,
        **recipe.teacher.load_options(),
    )
    pairs = layer_map(options, student.config.num_hidden_layers, teacher.config.num_hidden_layers)
    hidden_layers = [t for _, t in pairs] if weights.hidden > 0 else []
    relation = None
    if weights.relation > 0:
        layers = relation_layers(options, student, teacher)
        relation = (layers, frozen_projections(teacher, layers))
        hidden_layers = sorted({*hidden_layers, layers.teacher - 1})
    attention_layers = [t for s, t in pairs if s > 0 and t > 0] if weights.attention > 0 else []
    token_level = bool(hidden_layers or attention_layers)
    max_length = options.max_length or recipe.task.max_length
    teacher_sha = folder_weights_sha(teacher_dir)
    cache = {"cache_dir": ctx.cache_dir, "teacher_sha": teacher_sha, "max_length": max_length}
    with accelerator.main_process_first():
        transfer = transfer_split(ctx, options, teacher, teacher_tok, teacher_sha)
        teacher_enc = encode(teacher_tok, transfer, max_length)
        train_enc = student_encoding(tokenizer, teacher_tok, transfer, teacher_enc, max_length, token_level)
        targets = teacher_outputs(
            teacher,
            teacher_enc,
            data_sha=transfer.sha256,
            hidden_layers=hidden_layers,
            attention_layers=attention_layers,
            **cache,
        )
        evals = ctx.split("eval")
        teacher_eval = encode(teacher_tok, evals, max_length)
        eval_enc = student_encoding(tokenizer, teacher_tok, evals, teacher_eval, max_length, False)
        eval_logits = teacher_outputs(teacher, teacher_eval, data_sha=evals.sha256, **cache).logits
    offsets = None
    if weights.mlm > 0 and options.mlm.whole_word:
        offsets = tokenizer(
            transfer.texts,
            transfer.pairs,
            truncation=True,
            max_length=max_length,
            padding="longest",
            return_offsets_mapping=True,
            return_tensors="pt",
        )["offset_mapping"]
    labelled = sum(1 for y in transfer.labels or [] if y >= 0)
    return TransferData(
        train_enc=train_enc,
        targets=targets,
        offsets=offsets,
        eval_enc=eval_enc,
        eval_labels=evals.labels,
        eval_teacher_logits=eval_logits,
        teacher_accuracy=classification_metrics(eval_logits, evals.labels).get("accuracy"),
        teacher_width=teacher.config.hidden_size,
        pairs=pairs,
        relation=relation,
        info={
            "transfer_rows": len(transfer),
            "labelled_rows": labelled,
            "max_length": max_length,
            "teacher_sha": teacher_sha,
            "cached_teacher_layers": {"hidden": hidden_layers, "attentions": attention_layers},
            **({"relation": relation[0].to_json()} if relation is not None else {}),
        },
    )
