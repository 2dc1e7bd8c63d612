"""Cross-layer parameter sharing (ALBERT) applied to an already trained encoder.

Tying is structural: the encoder's layer list (or each layer's attention / feed-forward attribute)
is made to reference the SAME module object. ``parameters()`` then yields each shared tensor once,
so optimisers update one tensor, gradients from every use add up in it, and a state dict that is
de-duplicated by identity stores it once.

Relaxed sharing (``relax_rank``; Bae et al. 2024, "Relaxed Recursive Transformers") gives every tied
layer its own rank-r correction on each linear weight: W_i ~ W_shared + B_i A_i. Each layer keeps its
own container whose linear and norm modules are the shared objects, the linears wrapped with the
layer's two small matrices. B_i A_i starts as the truncated SVD of the layer's trained weight minus
the shared one, so at full rank the relaxed model computes exactly what the untied one did, and at
rank r each weight is off by the singular values the truncation discards. Cost: r x (in + out)
parameters per linear per layer, against in x out for an untied copy.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

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
    relax_rank: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"part": self.part, "groups": [list(g) for g in self.groups]}
        if self.relax_rank:
            out["relax_rank"] = self.relax_rank
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SharingPlan:
        rank = data.get("relax_rank")
        return cls(
            tuple(tuple(int(i) for i in g) for g in data["groups"]), data["part"], int(rank) if rank else None
        )


class RelaxedLinear(torch.nn.Module):
    """A shared linear layer plus one layer's own low-rank correction: ``base(x) + x Aᵀ Bᵀ``."""

    def __init__(self, base: torch.nn.Linear, rank: int):
        super().__init__()
        self.base = base
        weight = base.weight
        self.lora_a = torch.nn.Parameter(torch.zeros(rank, weight.shape[1], dtype=weight.dtype))
        self.lora_b = torch.nn.Parameter(torch.zeros(weight.shape[0], rank, dtype=weight.dtype))

    @property
    def weight(self) -> torch.Tensor:
        """The shared weight (what code that inspects ``.weight`` for dtype or shape expects)."""
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + F.linear(F.linear(x, self.lora_a), self.lora_b)

    @torch.no_grad()
    def init_from(self, weight: torch.Tensor) -> None:
        """B A = the rank-r truncated SVD of ``weight`` - shared weight (singular values split evenly)."""
        from compress.share.factorize import truncated_svd

        u, s, vh, _ = truncated_svd(weight - self.base.weight, self.lora_a.shape[0])
        root = s.sqrt()
        self.lora_b.copy_(u * root)
        self.lora_a.copy_(root[:, None] * vh)


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


def make_plan(
    mode: Mode, num_layers: int, groups: list[list[int]] | None = None, relax_rank: int | None = None
) -> SharingPlan:
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
    if relax_rank is not None and relax_rank <= 0:
        raise RecipeError(f"share.layers.relax_rank: {relax_rank} must be a positive rank, e.g. 16")
    part: Part = "layer" if mode in ("all", "groups") else mode
    return SharingPlan(tuple(tuple(g) for g in chosen), part, relax_rank)


@torch.no_grad()
def fit_shared_weights(
    shared: torch.nn.Module, originals: list[dict[str, torch.Tensor]], rank: int, max_steps: int = 20
) -> list[float]:
    """Fit each shared linear weight jointly with the layers' rank-r corrections (``init: fit``).

    Alternates the two least-squares steps of min sum_i ||W_i - W - B_i A_i||: the corrections are the
    rank-r SVD of W_i - W, then W is the mean of W_i - B_i A_i. Neither step can raise the error, so
    the shared weight ends closer to every layer than the plain mean does once corrections are added.
    Stops when an alternation gains < 0.1%. Returns the relative error ||.||² / sum_i ||W_i||² per step.
    """
    from compress.share.factorize import truncated_svd

    def low_rank(m: torch.Tensor) -> torch.Tensor:
        u, s, vh, _ = truncated_svd(m, min(rank, *m.shape))
        return (u * s) @ vh

    history: list[float] = []
    linears = [(n, m) for n, m in shared.named_modules() if isinstance(m, torch.nn.Linear)]
    weights = {n: [o[f"{n}.weight"].float() for o in originals] for n, _ in linears}
    total = sum(float((w**2).sum()) for ws in weights.values() for w in ws)
    current = {n: m.weight.detach().float() for n, m in linears}
    for _ in range(max_steps):
        error, fitted = 0.0, {}
        for name, ws in weights.items():
            residuals = [w - low_rank(w - current[name]) for w in ws]
            error += sum(float(((r - current[name]) ** 2).sum()) for r in residuals)
            fitted[name] = torch.stack(residuals).mean(dim=0)
        history.append(error / total)
        if len(history) > 1 and history[-2] - history[-1] < 1e-3 * history[-2]:
            break
        current = fitted
    for name, module in linears:
        module.weight.copy_(current[name].to(module.weight.dtype))
    return history


@torch.no_grad()
def _average_into(target: torch.nn.Module, modules: list[torch.nn.Module]) -> None:
    """Set every parameter of ``target`` to the element-wise mean over ``modules``."""
    named = [dict(m.named_parameters()) for m in modules]
    for name, param in target.named_parameters():
        param.copy_(torch.stack([n[name].detach() for n in named]).mean(dim=0))


def _relaxed_copy(
    shared: torch.nn.Module, rank: int, original: dict[str, torch.Tensor] | None
) -> torch.nn.Module:
    """A container of its own around ``shared``'s modules, each linear wrapped with a rank-r correction.

    ``original`` (the layer's trained parameters) initialises the corrections; None leaves them at
    zero for a loader to fill.
    """
    leaves = {id(m): m for m in shared.modules() if next(m.children(), None) is None}
    own = copy.deepcopy(shared, memo=dict(leaves))  # new containers, the same (shared) leaf modules
    for name, module in list(own.named_modules()):
        if isinstance(module, torch.nn.Linear):
            relaxed = RelaxedLinear(module, min(rank, *module.weight.shape))
            if original is not None:
                relaxed.init_from(original[f"{name}.weight"])
            own.set_submodule(name, relaxed)
    return own


def _get(layers: torch.nn.ModuleList, i: int, attr: str | None) -> torch.nn.Module:
    return layers[i] if attr is None else getattr(layers[i], attr)


def _put(layers: torch.nn.ModuleList, i: int, attr: str | None, module: torch.nn.Module) -> None:
    if attr is None:
        layers[i] = module
    else:
        setattr(layers[i], attr, module)


def _tie_group(
    layers: torch.nn.ModuleList,
    group: tuple[int, ...],
    attrs: tuple[str, ...] | None,
    init: Literal["mean", "fit"] | int,
    relax_rank: int | None,
    init_relaxation: bool,
) -> None:
    source = group[0] if init in ("mean", "fit") else group[init]
    for attr in [None] if attrs is None else attrs:  # the whole layer, or each module of a sub-block
        members = [_get(layers, i, attr) for i in group]
        originals: list[dict[str, torch.Tensor] | None] = (
            [{n: p.detach().clone() for n, p in m.named_parameters()} for m in members]
            if relax_rank and init_relaxation
            else [None] * len(group)
        )
        shared = _get(layers, source, attr)
        if init in ("mean", "fit"):
            _average_into(shared, members)
        if init == "fit" and relax_rank and init_relaxation:
            fit_shared_weights(shared, originals, relax_rank)
        for i, original in zip(group, originals, strict=True):
            _put(layers, i, attr, _relaxed_copy(shared, relax_rank, original) if relax_rank else shared)


def tie_layers(
    model: torch.nn.Module,
    plan: SharingPlan,
    init: Literal["mean", "fit"] | int = "mean",
    *,
    init_relaxation: bool = True,
) -> None:
    """Tie the layers of ``plan`` in place.

    ``init="mean"`` starts each shared module from the mean of the tied layers' weights (ALBERT
    shares from scratch; for a trained model the mean keeps every layer's contribution); an
    integer keeps the weights of that position within each group (0 = the group's first layer);
    ``"fit"`` (relaxed sharing only) starts from the mean and fits each shared linear weight jointly
    with the rank-r corrections (:func:`fit_shared_weights`).
    With ``plan.relax_rank`` each layer also gets its low-rank corrections, from the SVD of its own
    trained weights unless ``init_relaxation`` is False (a loader about to fill them).
    """
    layers, parts = _layout(model)
    make_plan("groups", len(layers), [list(g) for g in plan.groups])
    if init == "fit" and not plan.relax_rank:
        raise RecipeError(
            "share.layers.init: fit chooses the shared weights together with each layer's low-rank "
            "correction; set relax_rank too, or use init: mean"
        )
    if isinstance(init, int) and not all(-len(g) <= init < len(g) for g in plan.groups):
        raise RecipeError(
            f"share.layers.init: position {init} is outside a group of "
            f"{min(len(g) for g in plan.groups)} layers; use mean or a smaller position"
        )
    attrs = None if plan.part == "layer" else parts[plan.part]
    for group in plan.groups:
        _tie_group(layers, group, attrs, init, plan.relax_rank, init_relaxation)
