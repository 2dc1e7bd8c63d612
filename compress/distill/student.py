"""Build a shallower (optionally narrower) student from a teacher of the same architecture.

Layers are copied by renaming state-dict keys: the student's ``<layers>.<i>.`` takes the teacher's
``<layers>.<init[i]>.``; every other tensor (embeddings, pooler, classifier) is copied when its name
and shape match. That works for any encoder whose blocks live in one ``ModuleList``.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Literal

import torch

from compress.errors import ModelError

LAYER_LISTS = {
    "bert": "encoder.layer",
    "roberta": "encoder.layer",
    "xlm-roberta": "encoder.layer",
    "camembert": "encoder.layer",
    "electra": "encoder.layer",
    "distilbert": "transformer.layer",
    "albert": "encoder.albert_layer_groups",
}
"""Where each family keeps its transformer blocks, relative to the base model. ALBERT keeps layer
*groups* (usually one group shared by every layer)."""

Init = Literal["every-other", "random"] | list[int]


def layer_list_path(model: Any) -> str:
    """Dotted path (from the full model) of the ``ModuleList`` that holds the transformer blocks."""
    prefix = model.base_model_prefix
    known = LAYER_LISTS.get(model.config.model_type)
    if known is not None:
        return f"{prefix}.{known}"
    count = model.config.num_hidden_layers
    found = [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and len(module) == count
    ]
    if len(found) != 1:
        raise ModelError(
            f"model_type '{model.config.model_type}': cannot find its list of {count} transformer "
            f"layers (candidates: {found}); distill supports {', '.join(sorted(LAYER_LISTS))}"
        )
    return found[0]


def choose_layers(init: Init, teacher_layers: int, student_layers: int) -> list[int] | None:
    """The teacher layer (0-based) each student layer starts from; None for random init."""
    if init == "random":
        return None
    if init == "every-other":
        if student_layers * 2 <= teacher_layers:
            return [2 * i for i in range(student_layers)]
        step = teacher_layers / student_layers
        return [int(i * step) for i in range(student_layers)]
    chosen = list(init)
    if len(chosen) != student_layers:
        raise ModelError(
            f"init: lists {len(chosen)} teacher layers but layers is {student_layers}; "
            "give one teacher layer per student layer"
        )
    bad = [i for i in chosen if not 0 <= i < teacher_layers]
    if bad:
        raise ModelError(
            f"init: teacher layer(s) {bad} out of range; the teacher has layers 0..{teacher_layers - 1}"
        )
    return chosen


def student_config(
    teacher_config: Any, layers: int, hidden_size: int | None, intermediate_size: int | None
) -> Any:
    """The teacher's config with fewer layers (and optionally smaller widths)."""
    config = copy.deepcopy(teacher_config)
    config.num_hidden_layers = layers
    if config.model_type == "albert" and config.num_hidden_groups > 1:
        if config.num_hidden_groups != teacher_config.num_hidden_layers:
            raise ModelError(
                "ALBERT teacher with num_hidden_groups other than 1 or num_hidden_layers is not supported"
            )
        config.num_hidden_groups = layers
    if hidden_size is not None:
        heads = config.num_attention_heads
        if hidden_size % heads:
            raise ModelError(
                f"hidden_size: {hidden_size} is not divisible by the teacher's {heads} attention heads; "
                f"use a multiple of {heads}"
            )
        config.hidden_size = hidden_size
    if intermediate_size is not None:
        setattr(
            config,
            "hidden_dim" if config.model_type == "distilbert" else "intermediate_size",
            intermediate_size,
        )
    return config


def teacher_key(student_key: str, layer_path: str, chosen: list[int] | None, shared_groups: bool) -> str:
    """The teacher state-dict key a student key is initialised from."""
    match = re.match(rf"^{re.escape(layer_path)}\.(\d+)\.(.*)$", student_key)
    if match is None:
        return student_key
    if chosen is None:
        return ""
    index = 0 if shared_groups else chosen[int(match.group(1))]
    return f"{layer_path}.{index}.{match.group(2)}"


def build_student(
    teacher: Any,
    layers: int,
    init: Init = "every-other",
    *,
    hidden_size: int | None = None,
    intermediate_size: int | None = None,
) -> tuple[Any, dict[str, Any]]:
    """A student classifier initialised from ``teacher``; returns it and what was copied."""
    from transformers import AutoModelForSequenceClassification

    depth = teacher.config.num_hidden_layers
    if layers > depth:
        raise ModelError(f"layers: {layers} is more than the teacher's {depth} layers; choose 1..{depth}")
    chosen = choose_layers(init, depth, layers)
    config = student_config(teacher.config, layers, hidden_size, intermediate_size)
    student = AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa")
    path = layer_list_path(student)
    shared = config.model_type == "albert" and config.num_hidden_groups == 1
    source = teacher.state_dict()
    target = student.state_dict()
    copied, fresh = [], []
    for key, tensor in target.items():
        origin = teacher_key(key, path, chosen, shared)
        if origin in source and source[origin].shape == tensor.shape:
            tensor.copy_(source[origin])
            copied.append(key)
        else:
            fresh.append(key)
    student.eval()
    info = {
        "teacher_layers": chosen,
        "layer_list": path,
        "copied_tensors": len(copied),
        "fresh_tensors": fresh,
    }
    return student, info
