"""Exported artifacts of a shared model hold each shared weight once (ONNX initializers, TFLite buffers).

Exporters are known to duplicate tied weights (transformers issue 8869: ALBERT's ONNX several times
larger than its checkpoint), so the constants in each file are summed and compared with the model's
unique parameter bytes, and the whole file must be smaller than one extra copy of the shared layer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compress.models import load_classifier
from compress.share.factorize import factorize_embedding
from compress.share.model import parameter_stats, set_sharing_spec
from compress.share.tying import encoder_layers, make_plan, tie_layers
from compress.targets import load_target
from tests.helpers.tiny import make_tiny_bert

SLACK = 16_384
"""Bytes of small graph constants (shapes, masks, scalars) that are not parameters."""


@pytest.fixture(scope="module", params=[None, 8], ids=["tied", "relaxed-rank-8"])
def shared_model(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    folder = make_tiny_bert(tmp_path_factory.mktemp("wide"), layers=4, hidden=128)
    model, tokenizer = load_classifier(folder)
    torch.manual_seed(0)
    with torch.no_grad():  # trained LayerNorms differ (a fresh model's are all ones, hiding converter folds)
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.mul_(1 + 0.1 * torch.randn_like(module.weight))
    layer_bytes = sum(p.numel() * p.element_size() for p in encoder_layers(model)[0].parameters())
    plan = make_plan("all", 4, relax_rank=request.param)
    tie_layers(model, plan)
    factorize_embedding(model, 16)
    set_sharing_spec(model, layers=plan.to_json(), embedding_rank=16)
    return model.eval(), tokenizer, layer_bytes


def _onnx_constant_bytes(path: Path) -> int:
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    return sum(numpy_helper.to_array(t).nbytes for t in graph.initializer)


def _tflite_constant_bytes(path: Path) -> int:
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAsModel(path.read_bytes(), 0)
    return sum(model.Buffers(i).DataLength() or model.Buffers(i).Size() for i in range(model.BuffersLength()))


def _folder_bytes(folder: Path, suffixes: tuple[str, ...]) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.name.endswith(suffixes))


@pytest.mark.slow
def test_onnx_stores_each_shared_weight_once(shared_model, tmp_path: Path):
    from compress.export.onnx import export_onnx

    model, tokenizer, layer_bytes = shared_model
    unique = parameter_stats(model)["bytes"]
    export_onnx(model, tokenizer, tmp_path / "onnx", load_target("arm64-onnx"), max_length=32)
    constants = _onnx_constant_bytes(tmp_path / "onnx" / "model.onnx")
    assert constants <= unique + SLACK, (constants, unique)
    assert _folder_bytes(tmp_path / "onnx", (".onnx", ".data")) < unique + layer_bytes


@pytest.mark.slow
def test_tflite_stores_each_shared_weight_once(shared_model, tmp_path: Path):
    export_tflite = pytest.importorskip("compress.export.tflite").export_tflite

    model, tokenizer, layer_bytes = shared_model
    unique = parameter_stats(model)["bytes"]
    export_tflite(model, tokenizer, tmp_path / "tflite", load_target("android-arm64"))
    constants = _tflite_constant_bytes(tmp_path / "tflite" / "model.tflite")
    # Left to itself the converter folds the scale of the LayerNorm in front of the query/key/value
    # projections into their weights; layer 0 follows the embedding LayerNorm and the tied layers a
    # shared one, so the trained-like LayerNorms above would store those weights twice.
    assert constants <= unique + SLACK, (constants, unique)
    assert _folder_bytes(tmp_path / "tflite", (".tflite",)) < unique + layer_bytes


def test_unfolded_layer_norms_compute_the_same_and_restore_the_model(shared_model):
    from compress.export.tflite import unfolded_layer_norms

    model, tokenizer, _ = shared_model
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    batch = tokenizer(["a shared model", "stores each weight once"], padding=True, return_tensors="pt")
    with torch.no_grad():
        before = model(**batch).logits
        with unfolded_layer_norms(model):
            assert norms and all("forward" in m.__dict__ for m in norms)
            during = model(**batch).logits
        after = model(**batch).logits
    torch.testing.assert_close(during, before, rtol=1e-5, atol=1e-5)
    assert torch.equal(after, before)
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_unfolded_layer_norms_restore_the_model_when_conversion_fails(shared_model):
    from compress.export.tflite import unfolded_layer_norms

    model, _, _ = shared_model
    with pytest.raises(RuntimeError, match="converter failed"), unfolded_layer_norms(model):
        raise RuntimeError("converter failed")
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_unfolded_layer_norms_leave_a_layer_norm_subclass_with_its_own_forward_alone():
    from compress.export.tflite import unfolded_layer_norms

    class OffsetNorm(torch.nn.LayerNorm):  # like Nemotron's LayerNorm1P: scale is weight + 1
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.layer_norm(
                x, self.normalized_shape, self.weight + 1, self.bias, self.eps
            )

    model = torch.nn.Sequential(torch.nn.LayerNorm(8), OffsetNorm(8))
    with unfolded_layer_norms(model):
        assert "forward" in model[0].__dict__
        assert "forward" not in model[1].__dict__


@pytest.mark.slow
def test_int8_onnx_of_a_shared_model_stores_every_large_weight_int8(shared_model, tmp_path: Path):
    """A tied weight feeds several MatMuls through one Transpose unless it is folded; the quantizer then
    leaves it float (issue 16: 7 MB of a 10 MB "int8" file). After the fold it is int8 and stored once."""
    import onnx
    from onnx import numpy_helper

    from compress.export.onnx import export_onnx
    from compress.quantize.constants import onnx_float_constants
    from compress.quantize.onnx import quantize_onnx

    model, tokenizer, _ = shared_model
    export_onnx(model, tokenizer, tmp_path / "fp32", load_target("arm64-onnx"), max_length=32)
    fp32 = onnx.load(str(tmp_path / "fp32" / "model.onnx")).graph
    weights = {i.name for i in fp32.initializer}
    assert not any(n.op_type == "Transpose" and n.input[0] in weights for n in fp32.node)
    manifest = quantize_onnx(tmp_path / "fp32", tmp_path / "int8", scheme="dynamic")
    path = tmp_path / "int8" / "model.onnx"
    assert onnx_float_constants(path) == {}
    assert manifest["quantization"]["float_constant_bytes"] == 0
    graph = onnx.load(str(path)).graph
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    tied = [
        i
        for i in graph.initializer
        if "layer.3.intermediate" in i.name and i.data_type == onnx.TensorProto.INT8 and len(i.dims) == 2
    ]
    assert len(tied) == 1 and readers[tied[0].name] == 4  # one int8 copy read by all four layers
    assert numpy_helper.to_array(tied[0]).nbytes == 256 * 128


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["dynamic", "weight-only"])
def test_int8_tflite_of_a_shared_model_stores_every_large_weight_int8(shared_model, tmp_path: Path, scheme):
    export_tflite = pytest.importorskip("compress.export.tflite").export_tflite
    from compress.quantize.constants import tflite_float_constants
    from compress.quantize.tflite import quantize_tflite

    model, tokenizer, _ = shared_model
    export_tflite(model, tokenizer, tmp_path / "fp32", load_target("raspberry-pi-4"))
    # the fp32 file holds the position rows as a looked-up table, not a folded constant per signature
    assert not any("position" in name for name in tflite_float_constants(tmp_path / "fp32" / "model.tflite"))
    manifest = quantize_tflite(tmp_path / "fp32", tmp_path / "int8", scheme=scheme)
    assert tflite_float_constants(tmp_path / "int8" / "model.tflite") == {}
    assert manifest["quantization"]["float_constant_bytes"] == 0
