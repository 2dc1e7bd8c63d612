"""TFLite export: int32 inputs, one fixed-length signature per length, checked, weights stored once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compress.errors import ExportError
from compress.export import SAMPLE_TEXTS
from compress.export.tflite import buffer_stats, export_tflite
from compress.io import read_json
from compress.models import count_parameters, load_classifier
from compress.targets import TargetProfile


def profile(lengths: list[int]) -> TargetProfile:
    return TargetProfile(
        name="test-phone",
        format="tflite",
        runtime="litert",
        threads=2,
        sequence_lengths=lengths,
        input_dtype="int32",
    )


@pytest.fixture(scope="module")
def exported(tiny_bert_dir, tmp_path_factory):
    """One conversion shared by the tests below (litert-torch takes a few seconds per signature)."""
    model, tokenizer = load_classifier(tiny_bert_dir)
    folder = tmp_path_factory.mktemp("tflite") / "art"
    return model, tokenizer, folder, export_tflite(model, tokenizer, folder, profile([16, 32]))


def test_one_int32_signature_per_length_matching_pytorch(exported):
    model, tokenizer, folder, manifest = exported
    assert read_json(folder / "manifest.json") == manifest
    assert manifest["format"] == "tflite" and manifest["sequence_lengths"] == [16, 32]
    assert manifest["max_length"] == 32
    assert manifest["inputs"] == [
        {"name": n, "dtype": "int32", "shape": [1, 32]}
        for n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    assert manifest["outputs"] == [{"name": "logits", "dtype": "float32", "shape": [1, 2]}]
    assert manifest["check"]["first_token_only"] == {"applied": True}  # and the logits still match below
    assert {tuple(s) for s in manifest["check"]["shapes"]} == {(1, 16), (1, 32)}
    from ai_edge_litert.interpreter import Interpreter

    assert sorted(Interpreter(model_path=str(folder / "model.tflite")).get_signature_list()) == [
        "seq_16",
        "seq_32",
    ]
    from compress.runtime.runner import load

    got = load(folder).predict_logits(SAMPLE_TEXTS)
    enc = tokenizer(SAMPLE_TEXTS, padding=True, truncation=True, max_length=32, return_tensors="pt")
    with torch.no_grad():
        expected = model(**enc).logits.numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_signatures_share_one_copy_of_the_weights(exported):
    model, _, folder, manifest = exported
    assert manifest["check"]["duplicate_buffer_bytes"] == 0
    assert buffer_stats(folder / "model.tflite")["buffer_bytes"] <= count_parameters(model) * 4 * 1.1


def test_an_operator_the_converter_cannot_lower_is_named(tmp_path, tiny_bert_dir, monkeypatch):
    model, tokenizer = load_classifier(tiny_bert_dir)

    @torch.library.custom_op("compresstest::mystery_tflite", mutates_args=())
    def mystery(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @mystery.register_fake
    def _(x):
        return torch.empty_like(x)

    original = model.classifier.forward
    monkeypatch.setattr(model.classifier, "forward", lambda x: mystery(original(x)))
    with pytest.raises(ExportError, match=r"cannot lower operator 'compresstest\.mystery_tflite'"):
        export_tflite(model, tokenizer, tmp_path / "bad", profile([16]))
    assert not (tmp_path / "bad").exists()


def test_onnx_profile_is_refused(tmp_path, tiny_bert_dir):
    model, tokenizer = load_classifier(tiny_bert_dir)
    onnx_profile = TargetProfile(
        name="x", format="onnx", runtime="onnxruntime", sequence_lengths=[16], input_dtype="int64"
    )
    with pytest.raises(ExportError, match="wants onnx, not tflite"):
        export_tflite(model, tokenizer, tmp_path / "x", onnx_profile)


def test_the_last_layer_runs_on_the_first_token_only_when_nothing_else_reads_it(tiny_bert_dir):
    """Inside the context the last layer's output block sees one row and the logits are unchanged;
    a block tied to another layer is left alone; on exit the module is as it was."""
    from compress.export import Classifier, encode_batch
    from compress.export.tflite import first_token_last_layer

    model, tokenizer = load_classifier(tiny_bert_dir)
    module = Classifier(model.eval(), additive_mask=True).eval()
    enc = encode_batch(tokenizer, SAMPLE_TEXTS, None, module.names, length=None, max_length=32)
    inputs = {name: torch.as_tensor(enc[name]) for name in module.names}
    block = model.bert.encoder.layer[-1].attention.output
    seen = []
    hook = block.dense.register_forward_pre_hook(lambda _, args: seen.append(args[0].shape[1]))
    with torch.no_grad():
        full = module(**inputs)["logits"]
        with first_token_last_layer(module, tokenizer) as record:
            assert record == {"applied": True}
            seen.clear()
            torch.testing.assert_close(module(**inputs)["logits"], full, atol=1e-5, rtol=1e-4)
            assert seen == [1]
        seen.clear()
        module(**inputs)
        assert seen == [inputs["input_ids"].shape[1]] and "forward" not in block.__dict__
    hook.remove()
    model.bert.encoder.layer[0].attention.output = block  # tied across layers: not narrowed
    with first_token_last_layer(module, tokenizer) as record:
        assert record == {
            "applied": False,
            "reason": "the last layer's attention output block is tied to another layer",
        }
