"""The student plus everything trained with it (projection, MLM head) as one module that returns
its weighted loss terms, so data-parallel training syncs every trainable tensor in one place."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from compress.distill.config import INTERMEDIATE_TERMS, PREDICTION_TERMS, DistillOptions
from compress.distill.losses import (
    attention_mse,
    hard_ce,
    hidden_alignment,
    mlm_loss,
    mlm_model,
    relation_kl,
    soft_kl,
)
from compress.distill.rtd import detection_head, rtd_loss
from compress.errors import ModelError, RecipeError
from compress.training import forward_inputs

PROJECTIONS = (("attention.self", ("query", "key", "value")), ("attention", ("q_lin", "k_lin", "v_lin")))
"""Where a layer keeps its query/key/value projections: BERT, RoBERTa, ELECTRA, MiniLM; DistilBERT."""


@dataclass(frozen=True)
class Phase:
    """Epochs that train one set of loss terms with their own optimiser and schedule."""

    name: str
    epochs: int
    terms: tuple[str, ...]
    selects: bool
    """Whether held-out accuracy picks the best epoch and counts patience here."""
    int8: bool = False
    """Quantization-aware epochs: the student computes as dynamic int8 will (``compress.distill.qat``)."""
    lr: float | None = None
    """This phase's peak learning rate (default: the loop's)."""


def phases(options: DistillOptions) -> list[Phase]:
    """Every term at once, or TinyBERT's two steps (intermediate layers first, then predictions); then,
    with ``quantization_aware``, the last step's terms again as int8 computes the student.

    In the intermediate step the classifier head receives no gradient, so its held-out accuracy says
    nothing about the student and no epoch of that step is kept as the best one.
    """
    w = options.weights

    def active(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(n for n in names if getattr(w, n) > 0)

    n = options.intermediate_epochs
    if n == 0:
        steps = [Phase("joint", options.epochs, active(PREDICTION_TERMS + INTERMEDIATE_TERMS), True)]
    else:
        steps = [
            Phase("intermediate", n, active(INTERMEDIATE_TERMS), False),
            Phase("prediction", options.epochs - n, active(PREDICTION_TERMS), True),
        ]
    qat = options.quantization_aware
    if qat is not None:
        steps.append(Phase("int8", qat.epochs, steps[-1].terms, True, int8=True, lr=qat.lr))
    return steps


@dataclass(frozen=True)
class RelationLayers:
    """The resolved ``relation`` options: 1-based layers of each model and the relation heads."""

    student: int
    teacher: int
    heads: int
    relations: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "student_layer": self.student,
            "teacher_layer": self.teacher,
            "relation_heads": self.heads,
            "relations": list(self.relations),
        }


def qkv_projections(model: Any, layer: int) -> dict[str, torch.nn.Module]:
    """The query, key and value projections of encoder layer ``layer`` (1-based).

    The relation loss applies them to the layer's input (hidden state ``layer - 1``, which transformers
    records as that layer's input) instead of hooking them: a forward hook on a projection that
    cross-layer sharing reuses in several layers would fire once per layer.
    """
    from compress.distill.student import layer_list_path

    what = f"model_type '{model.config.model_type}'"
    try:
        layers = model.get_submodule(layer_list_path(model))
    except (AttributeError, ModelError) as exc:
        raise RecipeError(f"weights.relation: {what} has no list of encoder layers ({exc})") from None
    if len(layers) != model.config.num_hidden_layers:
        raise RecipeError(
            f"weights.relation: {what} keeps {len(layers)} layer modules for "
            f"{model.config.num_hidden_layers} layers (ALBERT-style groups); the relation loss supports "
            "BERT-family encoders and DistilBERT"
        )
    block = layers[layer - 1]
    for path, names in PROJECTIONS:
        try:
            parent = block.get_submodule(path)
        except AttributeError:
            continue
        if all(isinstance(getattr(parent, n, None), torch.nn.Module) for n in names):
            return {
                kind: getattr(parent, n) for kind, n in zip(("query", "key", "value"), names, strict=True)
            }
    raise RecipeError(
        f"weights.relation: {what} has no attention.self.query/key/value (BERT family) or "
        "attention.q_lin/k_lin/v_lin (DistilBERT) in its layers; set weights.relation: 0"
    )


def _layer(value: int | None, count: int, key: str, who: str) -> int:
    if value is None or value == -1:
        return count
    if value > count:
        raise RecipeError(
            f"relation.{key}: {value} is out of range; the {who} has layers 1..{count} (-1 = the last)"
        )
    return value


def relation_layers(options: DistillOptions, student: Any, teacher: Any) -> RelationLayers:
    """Resolve and check the ``relation`` options against both models (RecipeError naming the key)."""
    o = options.relation
    s = _layer(o.student_layer, student.config.num_hidden_layers, "student_layer", "student")
    t = _layer(o.teacher_layer, teacher.config.num_hidden_layers, "teacher_layer", "teacher")
    heads = o.relation_heads or teacher.config.num_attention_heads
    widths = {
        "student": qkv_projections(student, s)["query"].weight.shape[0],
        "teacher": qkv_projections(teacher, t)["query"].weight.shape[0],
    }
    for who, width in widths.items():
        if width % heads:
            default = "" if o.relation_heads else " (the default: the teacher's attention heads)"
            raise RecipeError(
                f"relation.relation_heads: {heads}{default} does not divide the {who}'s query width {width}; "
                f"give relation_heads that divides both {widths['student']} and {widths['teacher']}"
            )
    return RelationLayers(s, t, heads, tuple(o.relations))


def frozen_projections(teacher: Any, layers: RelationLayers) -> torch.nn.ModuleDict:
    """Copies of the teacher layer's projections, to apply to its cached input without the whole teacher."""
    chosen = qkv_projections(teacher, layers.teacher)
    copies = torch.nn.ModuleDict({k: copy.deepcopy(chosen[k]).float() for k in layers.relations})
    return copies.requires_grad_(False)


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
    """Student + optional projection (TinyBERT W_h) + optional MLM head sharing the student's encoder +
    optional replaced-token detection head (ELECTRA's discriminator head)."""

    def __init__(
        self,
        student: Any,
        options: DistillOptions,
        pairs: list[tuple[int, int]],
        teacher_width: int,
        relation: tuple[RelationLayers, torch.nn.ModuleDict] | None = None,
    ):
        """``relation`` (with ``weights.relation`` > 0): the resolved layers and the teacher's frozen
        projections."""
        super().__init__()
        self.student = student
        self.options = options
        self.pairs = pairs
        self.attention_pairs = [(s, t) for s, t in pairs if s > 0 and t > 0]
        width = student.config.hidden_size
        needs_projection = options.weights.hidden > 0 and width != teacher_width
        self.projection = torch.nn.Linear(width, teacher_width) if needs_projection else None
        self.mlm = mlm_model(student) if options.weights.mlm > 0 else None
        self.detector = detection_head(student.config) if options.weights.rtd > 0 else None
        if options.weights.relation > 0 and relation is None:
            raise ValueError(
                "weights.relation > 0 needs the resolved relation layers and teacher projections"
            )
        self.relation_layers = relation[0] if relation is not None else None
        self.teacher_projections = relation[1] if relation is not None else None
        self.active: tuple[str, ...] = phases(options)[0].terms
        """The terms ``forward`` computes; the trainer sets it at the start of each phase."""

    def forward(
        self,
        batch: dict[str, torch.Tensor],
        target: dict[str, Any],
        mlm_batch: tuple[torch.Tensor, torch.Tensor] | None,
        rtd_batch: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Each term of the current phase (``active``), unweighted; ``total`` is the weighted sum.

        ``mlm_batch`` / ``rtd_batch``: (masked or corrupted ids, token labels) at the batch's full padded
        length; ``batch`` may be cut to its longest row."""
        w, active, inputs = self.options.weights, self.active, forward_inputs(self.student, batch)
        mask = inputs["attention_mask"]
        out = self.student(
            **inputs,
            output_hidden_states="hidden" in active or "relation" in active,
            output_attentions="attention" in active,
        )
        terms: dict[str, torch.Tensor] = {}
        if "soft" in active:
            terms["soft"] = soft_kl(out.logits, target["logits"], self.options.temperature)
        if "hard" in active:
            terms["hard"] = hard_ce(out.logits, batch["labels"])
        if "hidden" in active:
            student_states = {s: out.hidden_states[s] for s, _ in self.pairs}
            terms["hidden"] = hidden_alignment(
                student_states,
                target["hidden"],
                self.pairs,
                mask,
                self.options.hidden.metric,
                self.projection,
            )
        if "attention" in active:
            student_maps = {s: out.attentions[s - 1] for s, _ in self.attention_pairs}
            terms["attention"] = attention_mse(student_maps, target["attentions"], self.attention_pairs, mask)
        if "relation" in active:
            terms["relation"] = self.relation(out.hidden_states, target["hidden"], mask)
        if "mlm" in active and mlm_batch is not None:
            masked, labels = mlm_batch
            length = masked.shape[1]
            mlm_inputs = {**inputs, "input_ids": masked[:, : inputs["input_ids"].shape[1]]}
            terms["mlm"] = mlm_loss(self.mlm(**mlm_inputs).logits, labels[:, : min(length, mask.shape[1])])
        if "rtd" in active and rtd_batch is not None:
            corrupted, labels = rtd_batch
            length = inputs["input_ids"].shape[1]
            encoder = self.student.base_model(**{**inputs, "input_ids": corrupted[:, :length]})
            terms["rtd"] = rtd_loss(self.detector(encoder[0]), labels[:, :length])
        terms["total"] = sum(getattr(w, name) * value for name, value in terms.items())
        return terms

    def relation(
        self,
        student_states: tuple[torch.Tensor, ...],
        teacher_states: dict[int, torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """MiniLM's relation term: each model's chosen layer's Q/K/V, from that layer's input.

        The teacher's input comes from the cache (hidden state ``teacher - 1``), so the teacher never
        runs during training; only its three projections are applied to it.
        """
        layers, teacher = self.relation_layers, self.teacher_projections
        source = student_states[layers.student - 1]
        student = qkv_projections(self.student, layers.student)
        with torch.no_grad():
            cached = teacher_states[layers.teacher - 1].to(source.device, torch.float32)
            targets = {k: teacher[k](cached) for k in layers.relations}
        return relation_kl({k: student[k](source) for k in layers.relations}, targets, mask, layers.heads)
