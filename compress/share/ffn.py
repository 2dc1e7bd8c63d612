"""Feed-forward width pruning: keep, in every layer, the neurons that carry most of its output.

A BERT layer spends two thirds of its weights on the feed-forward block (H x I in, I x H out, I = 4H).
Its I hidden neurons are independent given the input, so dropping neuron i removes one row of the
first linear, one column of the second, and exactly the term ``a_i(x) * W_out[:, i]`` from the
block's output. The expected squared size of that term over real tokens of the task's text,
``E[a_i(x)^2] * ||W_out[:, i]||^2``, ranks the neurons (the output-energy criterion of structured
FFN pruning, as in CoFi's and Sheared LLaMA's width masks, without their learned masks). The kept
count is the same in every layer, so the result is a plain Hugging Face model with a smaller
``intermediate_size`` that every exporter and runtime reads like any other; recovery distillation then
wins back what the dropped neurons carried. Unlike tying, nothing is shared, so an exported graph
keeps the stock layer pattern (ONNX Runtime fuses its attention) and every weight stays a plain
per-layer constant that int8 quantizes.
"""

from __future__ import annotations

from typing import Any

import torch

from compress.errors import ModelError, RecipeError

# Per encoder family: a layer's first and second feed-forward linear, and the config key of their width.
_FFN_LAYOUTS: list[tuple[str, str, str]] = [
    ("intermediate.dense", "output.dense", "intermediate_size"),
    ("ffn.lin1", "ffn.lin2", "hidden_dim"),
]


def _get(node: Any, path: str) -> Any:
    for attr in path.split("."):
        node = getattr(node, attr, None)
    return node


def ffn_linears(model: torch.nn.Module) -> tuple[list[tuple[torch.nn.Linear, torch.nn.Linear]], str]:
    """Each layer's (first, second) feed-forward linear and the config key that sizes them."""
    from compress.share.tying import encoder_layers

    layers = encoder_layers(model)
    for first, second, key in _FFN_LAYOUTS:
        pairs = [(_get(layer, first), _get(layer, second)) for layer in layers]
        if not all(type(a) is torch.nn.Linear and type(b) is torch.nn.Linear for a, b in pairs):
            continue
        if len({id(b) for _, b in pairs}) < len(pairs):
            raise ModelError(
                "share.ffn: this model's feed-forward blocks are tied by an earlier share stage; "
                "put ffn: N in that stage (it prunes before it ties)"
            )
        return pairs, key
    raise ModelError(
        f"{type(model).__name__}: share.ffn needs plain linear feed-forward blocks (BERT, RoBERTa, "
        "ELECTRA, MiniLM, DistilBERT) that no earlier share stage relaxed; prune before tying layers"
    )


def check_size(model: torch.nn.Module, size: int) -> None:
    """Refuse a width the layers cannot be pruned to (before any neuron is ranked)."""
    pairs, _ = ffn_linears(model)
    widths = {second.in_features for _, second in pairs}
    if len(widths) != 1:
        raise ModelError(f"share.ffn: the layers' feed-forward widths differ ({sorted(widths)}); need one")
    width = widths.pop()
    if not 0 < size < width:
        raise RecipeError(
            f"share.ffn: {size} must be between 1 and {width - 1} (the feed-forward width is {width}); "
            f"e.g. ffn: {width * 2 // 3}"
        )


@torch.no_grad()
def neuron_importance(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    """Per layer, ``E[a_i^2] * ||W_out[:, i]||^2`` over the non-padding tokens of ``batches``."""
    pairs, _ = ffn_linears(model)
    sums = [torch.zeros(second.in_features, dtype=torch.float64) for _, second in pairs]
    current: dict[str, torch.Tensor] = {}  # the batch's attention mask, read by the hooks
    tokens = 0

    def hook(index: int):
        def record(_module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            activations = inputs[0].double() ** 2  # (batch, seq, I): the second linear's input
            sums[index] += (activations * current["mask"][..., None]).sum(dim=(0, 1))

        return record

    handles = [second.register_forward_pre_hook(hook(i)) for i, (_, second) in enumerate(pairs)]
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            current["mask"] = batch["attention_mask"].double()
            tokens += int(batch["attention_mask"].sum())
            model(**batch)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if tokens == 0:
        raise RecipeError("share.ffn: the training text gave no tokens to rank the neurons with")
    norms = [second.weight.double().pow(2).sum(dim=0) for _, second in pairs]
    return [total / tokens * norm for total, norm in zip(sums, norms, strict=True)]


@torch.no_grad()
def prune_ffn(model: torch.nn.Module, size: int, importance: list[torch.Tensor]) -> dict[str, Any]:
    """Keep the ``size`` most important neurons of every layer's feed-forward block, in their order.

    Returns the width before and after and the share of the measured output energy kept per layer.
    """
    check_size(model, size)
    pairs, key = ffn_linears(model)
    width = pairs[0][1].in_features
    kept_energy = []
    for (first, second), score in zip(pairs, importance, strict=True):
        keep = torch.topk(score, size).indices.sort().values
        kept_energy.append(round(float(score[keep].sum() / score.sum().clamp_min(1e-30)), 4))
        _shrink(first, keep, dim=0)
        _shrink(second, keep, dim=1)
    setattr(model.config, key, size)
    return {"ffn_before": width, "ffn_after": size, "energy_kept": kept_energy}


def _shrink(linear: torch.nn.Linear, keep: torch.Tensor, dim: int) -> None:
    """Keep ``keep`` of the linear's outputs (dim 0) or inputs (dim 1), in place."""
    weight = linear.weight.index_select(dim, keep).clone()
    linear.weight = torch.nn.Parameter(weight, requires_grad=linear.weight.requires_grad)
    if dim == 0:
        linear.out_features = len(keep)
        if linear.bias is not None:
            linear.bias = torch.nn.Parameter(
                linear.bias.index_select(0, keep).clone(), requires_grad=linear.bias.requires_grad
            )
    else:
        linear.in_features = len(keep)
