"""Quantization-aware recovery computes what onnxruntime's dynamic int8 computes, only inside its block."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from compress.distill.config import DistillOptions
from compress.distill.objective import phases
from compress.distill.qat import fake_activation, fake_int8, fake_weight
from compress.share.tying import RelaxedLinear


def ort_dynamic_int8(weight: np.ndarray, x: np.ndarray, tmp_path) -> np.ndarray:
    """x @ weightᵀ through onnxruntime's quantize_dynamic (per-channel int8), as the quantize stage does."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    b = numpy_helper.from_array(weight.T.copy(), "B")
    node = helper.make_node("MatMul", ["X", "B"], ["Y"], name="mm")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, weight.shape[1]])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, weight.shape[0]])],
        [b],
    )
    source, target = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    quantize_dynamic(source, target, per_channel=True, weight_type=QuantType.QInt8)
    ops = {n.op_type for n in onnx.load(target).graph.node}
    assert "MatMulInteger" in ops, ops
    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    return session.run(None, {"X": x})[0]


def test_simulation_matches_onnxruntime_dynamic_int8(tmp_path):
    rng = np.random.default_rng(0)
    # rows of very different scales, so per-channel rounding matters; a skewed activation (zero point > 0)
    weight = (rng.standard_normal((48, 64)) * rng.uniform(0.01, 1.0, (48, 1))).astype(np.float32)
    x = (rng.standard_normal((1, 64)) * 2 + 0.7).astype(np.float32)
    got = ort_dynamic_int8(weight, x, tmp_path)
    simulated = torch.nn.functional.linear(
        fake_activation(torch.from_numpy(x)), fake_weight(torch.from_numpy(weight))
    ).numpy()
    exact = x @ weight.T
    # int8 really differs from float here, and the simulation computes int8's outputs; not every one: on
    # x86 without VNNI, onnxruntime's u8 x s8 kernel adds pairs of products in saturating int16, so an
    # output may differ where two large products meet (arm64's kernels do not saturate)
    assert np.mean(np.abs(got - exact) < 1e-3) < 0.2
    assert np.mean(np.abs(got - simulated) < 1e-4) >= 0.9


def test_each_row_of_a_batch_gets_its_own_activation_range():
    x = torch.stack([torch.linspace(-1, 1, 50), torch.linspace(-100, 100, 50)])
    rounded = fake_activation(x)
    # the small row is rounded on its own grid (~2/255), not the large row's (~200/255)
    assert (rounded[0] - x[0]).abs().max() <= 1 / 255 + 1e-6
    assert (rounded[1] - x[1]).abs().max() <= 100 / 255 + 1e-4
    assert fake_activation(x[:1])[0].allclose(rounded[0])


def test_fake_int8_applies_inside_the_block_only_and_passes_gradients():
    torch.manual_seed(0)
    base = torch.nn.Linear(32, 32)
    relaxed = RelaxedLinear(base, 4)
    torch.nn.init.normal_(relaxed.lora_a)
    torch.nn.init.normal_(relaxed.lora_b)
    model = torch.nn.Sequential(relaxed, torch.nn.GELU(), torch.nn.Linear(32, 2))
    x = torch.randn(3, 7, 32)
    before = model(x).detach()
    with fake_int8(model) as layers:
        assert layers == 3  # the head, the relaxed layer and its shared base
        inside = model(x)
        inside.sum().backward()
    assert not torch.allclose(inside.detach(), before)
    assert (inside.detach() - before).abs().max() < 0.1 * before.abs().max()
    assert torch.equal(model(x).detach(), before)  # the class's own forward is back
    for p in (relaxed.lora_a, relaxed.lora_b, base.weight, model[2].weight):
        assert p.grad is not None and p.grad.abs().sum() > 0  # straight-through gradients reach every weight
    assert not any("forward" in vars(m) for m in model.modules())


@pytest.mark.parametrize("intermediate", [0, 1])
def test_int8_epochs_follow_the_last_step_with_its_terms(intermediate):
    weights = {"soft": 1.0, "hidden": 1.0}
    options = DistillOptions(
        epochs=3,
        intermediate_epochs=intermediate,
        weights=weights,
        quantization_aware={"epochs": 2, "lr": 1e-5},
    )
    steps = phases(options)
    assert [p.int8 for p in steps] == [False] * (len(steps) - 1) + [True]
    last = steps[-1]
    assert (last.epochs, last.lr, last.selects, last.terms) == (2, 1e-5, True, steps[-2].terms)
    assert sum(p.epochs for p in steps) == 5
    assert not any(p.int8 for p in phases(DistillOptions(epochs=3)))
