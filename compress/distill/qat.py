"""Quantization-aware recovery: train and evaluate the student as dynamic int8 will compute it.

ONNX Runtime's ``quantize_dynamic`` (per-channel) and LiteRT's dynamic int8 (XNNPACK) run every linear
layer with a constant weight as an integer matmul: the weight symmetric int8 per output channel in
[-127, 127] (scale = max |w| / 127), the activation quantized when the request arrives, asymmetric
uint8 over its own range widened to include 0 (``DynamicQuantizeLinear``). Matmuls between two
activations (attention scores) stay float (``MatMulConstBOnly``). Inside :func:`fake_int8` every such
layer of the student computes exactly that rounding with torch's fake-quantize ops, whose gradient is
the straight-through estimate, so the last epochs learn weights the int8 artifact keeps.

A request is one sentence (batch 1), so in training each row of a batch gets its own activation range.
The stored weights stay float: the quantize stage rounds them as the simulation did.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

WEIGHT_RANGE = (-127, 127)
"""Symmetric int8 as onnxruntime quantizes a weight (``get_qmin_qmax_for_qType(QInt8, symmetric=True)``)."""
ACTIVATION_RANGE = (0, 255)
"""uint8, as ``DynamicQuantizeLinear`` quantizes an activation."""


def fake_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (out x in) rounded to symmetric int8 per output row, in float."""
    scale = (weight.detach().abs().amax(dim=1).float() / WEIGHT_RANGE[1]).clamp(min=1e-12)
    zero = torch.zeros_like(scale, dtype=torch.int32)
    return torch.fake_quantize_per_channel_affine(weight, scale, zero, 0, *WEIGHT_RANGE)


def fake_activation(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to uint8 over each row's range widened to include 0 (batch 1 at inference)."""
    rows = x.detach().reshape(x.shape[0], -1) if x.dim() > 1 else x.detach().reshape(1, -1)
    low = rows.amin(dim=1).clamp(max=0).float()
    high = rows.amax(dim=1).clamp(min=0).float()
    scale = ((high - low) / ACTIVATION_RANGE[1]).clamp(min=1e-12)
    zero = (-low / scale).round().clamp(*ACTIVATION_RANGE).to(torch.int32)
    if x.dim() == 1:
        return torch.fake_quantize_per_tensor_affine(x, scale[0], zero[0], *ACTIVATION_RANGE)
    return torch.fake_quantize_per_channel_affine(x, scale, zero, 0, *ACTIVATION_RANGE)


def _linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(fake_activation(x), fake_weight(self.weight), self.bias)


def _relaxed(self: Any, x: torch.Tensor) -> torch.Tensor:
    # base(x) is an nn.Linear (simulated itself); the correction is two more constant-weight matmuls
    low = F.linear(fake_activation(x), fake_weight(self.lora_a))
    return self.base(x) + F.linear(fake_activation(low), fake_weight(self.lora_b))


def simulated_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The student's layers that int8 runs as integer matmuls: every ``nn.Linear`` and every shared
    layer's low-rank correction."""
    from compress.share.tying import RelaxedLinear

    return [(n, m) for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, RelaxedLinear))]


@contextlib.contextmanager
def fake_int8(model: torch.nn.Module) -> Iterator[int]:
    """Within the block, ``model``'s linear layers compute as dynamic int8 does; yields how many."""
    from compress.share.tying import RelaxedLinear

    layers = [m for _, m in simulated_layers(model)]
    for module in layers:
        forward = _relaxed if isinstance(module, RelaxedLinear) else _linear
        module.forward = types.MethodType(forward, module)  # type: ignore[method-assign]
    try:
        yield len(layers)
    finally:
        for module in layers:
            del module.forward  # back to the class's own forward
