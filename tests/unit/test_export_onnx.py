"""ONNX export: the artifact folder contract, the export check, shared weights stored once, clear failures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compress.errors import ExportError
from compress.export import SAMPLE_TEXTS, Classifier, input_names
from compress.export.onnx import dedupe_initializers, export_onnx
from compress.io import read_json, sha256_file
from compress.models import count_parameters, load_classifier
from compress.targets import load_target


@pytest.fixture(scope="module")
def tiny(tiny_bert_dir):
    return load_classifier(tiny_bert_dir)


def float_initializer_bytes(path) -> int:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    return sum(numpy_helper.to_array(i).nbytes for i in model.graph.initializer if i.data_type == 1)


def test_export_writes_the_artifact_contract_and_matches_pytorch(tmp_path, tiny):
    model, tokenizer = tiny
    manifest = export_onnx(
        model, tokenizer, tmp_path / "art", load_target("arm64-onnx"), name="01-export/art"
    )
    folder = tmp_path / "art"
    assert read_json(folder / "manifest.json") == manifest
    assert manifest["kind"] == "artifact" and manifest["format"] == "onnx" and manifest["precision"] == "fp32"
    assert [i["name"] for i in manifest["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(i["dtype"] == "int64" and i["shape"] == ["batch", "sequence"] for i in manifest["inputs"])
    assert manifest["outputs"] == [{"name": "logits", "dtype": "float32", "shape": ["batch", 2]}]
    assert read_json(folder / "labels.json") == ["l0", "l1"]
    files = {e["path"]: e["sha256"] for e in manifest["files"]}
    assert set(files) == {"model.onnx", "tokenizer.json", "labels.json"}
    assert files["model.onnx"] == sha256_file(folder / "model.onnx")
    # several batch sizes and lengths were checked, and the runner predicts what PyTorch predicts
    assert len({tuple(s) for s in manifest["check"]["shapes"]}) >= 3
    from compress.runtime.runner import load

    got = load(folder).predict_logits(SAMPLE_TEXTS, batch_size=4)
    enc = tokenizer(SAMPLE_TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model(**enc).logits.numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_shared_layers_are_stored_once(tmp_path, tiny_bert_dir):
    model, tokenizer = load_classifier(tiny_bert_dir)
    model.bert.encoder.layer[1] = model.bert.encoder.layer[0]
    export_onnx(model, tokenizer, tmp_path / "tied", load_target("arm64-onnx"))
    stored = float_initializer_bytes(tmp_path / "tied" / "model.onnx")
    assert stored <= count_parameters(model) * 4


def test_duplicate_initializers_are_merged():
    import onnx
    from onnx import helper, numpy_helper

    weight = np.arange(12, dtype=np.float32).reshape(3, 4)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["a"]),
            helper.make_node("MatMul", ["a2", "w2"], ["y"]),
            helper.make_node("Identity", ["a"], ["a2"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(weight, "w1"), numpy_helper.from_array(weight.copy(), "w2")],
    )
    model = helper.make_model(graph)
    assert dedupe_initializers(model) == 1
    assert [i.name for i in model.graph.initializer] == ["w1"]
    assert list(model.graph.node[1].input) == ["a2", "w1"]


def test_an_operator_the_exporter_cannot_lower_is_named(tmp_path, tiny, monkeypatch):
    model, tokenizer = tiny

    @torch.library.custom_op("compresstest::mystery_onnx", mutates_args=())
    def mystery(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @mystery.register_fake
    def _(x):
        return torch.empty_like(x)

    original = model.classifier.forward
    monkeypatch.setattr(model.classifier, "forward", lambda x: mystery(original(x)))
    with pytest.raises(ExportError, match=r"cannot lower operator 'compresstest\.mystery_onnx'"):
        export_onnx(model, tokenizer, tmp_path / "bad", load_target("arm64-onnx"))
    assert not (tmp_path / "bad").exists()


def test_a_failed_export_check_is_an_error(tmp_path, tiny, monkeypatch):
    import compress.export.onnx as onnx_export

    real = onnx_export.onnx_runner

    def drifting(path, threads=1):
        run = real(path, threads)
        return lambda feeds: run(feeds) + 0.5

    monkeypatch.setattr(onnx_export, "onnx_runner", drifting)
    model, tokenizer = tiny
    with pytest.raises(ExportError, match="logits differ from PyTorch"):
        export_onnx(model, tokenizer, tmp_path / "drift", load_target("arm64-onnx"))
    assert not (tmp_path / "drift").exists()


def test_wrapper_takes_int32_ids_and_drops_unused_token_types(tiny):
    model, _ = tiny
    assert input_names(model) == ["input_ids", "attention_mask", "token_type_ids"]
    ids = torch.tensor([[2, 10, 3]], dtype=torch.int32)
    out = Classifier(model)(ids, torch.ones_like(ids), torch.zeros_like(ids))
    assert out["logits"].shape == (1, 2)
