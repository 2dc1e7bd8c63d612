"""Cross-layer parameter sharing (ALBERT) applied to an already trained encoder.

Tying is structural: the encoder's layer list (or each layer's attention / feed-forward attribute)
is made to reference the SAME module object. ``parameters()`` then yields each shared tensor once,
so optimisers update one tensor, gradients from every use add up in it, and a state dict that is
de-duplicated by identity stores it once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from compress.errors import ModelError, RecipeError

Part = Literal["layer", "attention", "ffn"]
Mode = Literal["all", "attention", "ffn", "groups"]

# Where each BERT-family encoder keeps its layer list, and which layer attributes form a sub-block.
_LAYOUTS: list[tuple[str, dict[str, tuple[str, ...]]]] = [
    ("encoder.layer", {"attention": ("attention",), "ffn": ("intermediate", "output")}),
    ("transformer.layer", {"attention": ("attention", "sa_layer_norm"), "ffn": ("ffn", "output_layer_norm")}),
]


@dataclass(frozen=True)
class SharingPlan:
    """Which layers share which part: each group of layer indices ends up with one set of weights."""

    groups: tuple[tuple[int, ...], ...]
    part: Part

    def to_json(self) -> dict[str, Any]:
        return {"part": self.part, "groups": [list(g) for g in self.groups]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SharingPlan:
        return cls(tuple(tuple(int(i) for i in g) for g in data["groups"]), data["part"])


def _layout(model: torch.nn.Module) -> tuple[torch.nn.ModuleList, dict[str, tuple[str, ...]]]:
    base = getattr(model, "base_model", model)
    for path, parts in _LAYOUTS:
        node: Any = base
        for attr in path.split("."):
            node = getattr(node, attr, None)
        if isinstance(node, torch.nn.ModuleList):
            return node, parts
    raise ModelError(
        f"{type(model).__name__}: layer sharing supports BERT-family encoders "
        "(BERT, RoBERTa, ELECTRA, MiniLM, DistilBERT); this model has no encoder layer list"
    )


def encoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The encoder's list of transformer layers (one entry per applied layer, shared or not)."""
    return _layout(model)[0]


def make_plan(mode: Mode, num_layers: int, groups: list[list[int]] | None = None) -> SharingPlan:
    """Turn the recipe's ``mode``/``groups`` into a plan, rejecting groups that cannot work."""
    if mode == "groups" and not groups:
        raise RecipeError("share.layers.groups: mode 'groups' needs groups, e.g. groups: [[0, 1], [2, 3]]")
    if mode == "all" and groups:
        raise RecipeError("share.layers.groups: mode 'all' ties every layer; use mode: groups to list groups")
    chosen = groups or [list(range(num_layers))]
    seen: dict[int, int] = {}
    for number, group in enumerate(chosen):
        if len(group) < 2:
            raise RecipeError(
                f"share.layers.groups[{number}]: {group} has fewer than two layers; nothing to share"
            )
        for index in group:
            if not 0 <= index < num_layers:
                raise RecipeError(
                    f"share.layers.groups[{number}]: layer {index} is out of range; "
                    f"the model has layers 0..{num_layers - 1}"
                )
            if index in seen:
                raise RecipeError(
                    f"share.layers.groups: layer {index} is in group {seen[index]} and group {number}; "
                    "each layer may be in one group only"
                )
            seen[index] = number
    part: Part = "layer" if mode in ("all", "groups") else mode
    return SharingPlan(tuple(tuple(g) for g in chosen), part)


@torch.no_grad()
def _average_into(target: torch.nn.Module, modules: list[torch.nn.Module]) -> None:
    """Set every parameter of ``target`` to the element-wise mean over ``modules``."""
    named = [dict(m.named_parameters()) for m in modules]
    for name, param in target.named_parameters():
        param.copy_(torch.stack([n[name].detach() for n in named]).mean(dim=0))


def _tie_group(
    layers: torch.nn.ModuleList,
    group: tuple[int, ...],
    attrs: tuple[str, ...] | None,
    init: Literal["mean"] | int,
) -> None:
    source = group[0] if init == "mean" else group[init]
    if attrs is None:
        members = [layers[i] for i in group]
        if init == "mean":
            _average_into(layers[source], members)
        for i in group:
            layers[i] = layers[source]
        return
    for attr in attrs:
        members = [getattr(layers[i], attr) for i in group]
        shared = getattr(layers[source], attr)
        if init == "mean":
            _average_into(shared, members)
        for i in group:
            setattr(layers[i], attr, shared)


def tie_layers(model: torch.nn.Module, plan: SharingPlan, init: Literal["mean"] | int = "mean") -> None:
    """Tie the layers of ``plan`` in place.

    ``init="mean"`` starts each shared module from the mean of the tied layers' weights (ALBERT
    shares from scratch; for a trained model the mean keeps every layer's contribution); an
    integer keeps the weights of that position within each group (0 = the group's first layer).
    """
    layers, parts = _layout(model)
    make_plan("groups", len(layers), [list(g) for g in plan.groups])
    if isinstance(init, int) and not all(-len(g) <= init < len(g) for g in plan.groups):
        raise RecipeError(
            f"share.layers.init: position {init} is outside a group of "
            f"{min(len(g) for g in plan.groups)} layers; use mean or a smaller position"
        )
    attrs = None if plan.part == "layer" else parts[plan.part]
    for group in plan.groups:
        _tie_group(layers, group, attrs, init)
