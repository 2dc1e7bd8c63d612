"""`compress eval` on tiny ONNX and TFLite artifacts reproduces numbers computed here, directly with
onnxruntime / ai-edge-litert and PyTorch. Latency is never asserted: only that it was measured."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from compress.cli import Group
from compress.cli_report import COMMANDS
from compress.data import load_file
from compress.io import file_entries, sha256_file, write_json_atomic

MAX_LENGTH = 16


def _module(folder: Path):
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(
        str(folder), attn_implementation="eager"
    ).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(
                input_ids=input_ids.long(),
                attention_mask=attention_mask.long(),
                token_type_ids=token_type_ids.long(),
            ).logits

    return Logits()


def _finish(folder: Path, source: Path, fmt: str) -> Path:
    """The artifact folder contract: model file, tokenizer.json, labels.json, manifest.json."""
    shutil.copy(source / "tokenizer.json", folder / "tokenizer.json")
    labels = json.loads((source / "config.json").read_text())["id2label"]
    (folder / "labels.json").write_text(json.dumps([labels[k] for k in sorted(labels, key=int)]))
    write_json_atomic(
        folder / "manifest.json",
        {
            "kind": "artifact",
            "name": f"09-export/tiny-{fmt}",
            "format": fmt,
            "target": None,
            "threads": 1,
            "precision": "fp32",
            "quantization": None,
            "max_length": MAX_LENGTH,
            "sequence_lengths": [MAX_LENGTH],
            "task": {"text_pair": False},
            "files": file_entries(folder),
        },
    )
    return folder


@pytest.fixture(scope="module")
def onnx_artifact(tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    folder = tmp_path_factory.mktemp("onnx-artifact")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = tuple(torch.ones(1, 8, dtype=torch.long) for _ in names)
    torch.onnx.export(
        _module(tiny_bert_dir),
        example,
        str(folder / "model.onnx"),
        input_names=names,
        output_names=["logits"],
        dynamic_axes={n: {0: "batch", 1: "sequence"} for n in names},
        dynamo=False,
        opset_version=17,
    )
    return _finish(folder, tiny_bert_dir, "onnx")


@pytest.fixture(scope="module")
def tflite_artifact(tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import litert_torch
    import torch

    folder = tmp_path_factory.mktemp("tflite-artifact")
    ids = torch.ones(1, MAX_LENGTH, dtype=torch.int32)
    sample = {"input_ids": ids, "attention_mask": ids, "token_type_ids": torch.zeros_like(ids)}
    converter = litert_torch.Converter().signature(
        f"seq_{MAX_LENGTH}", _module(tiny_bert_dir), sample_kwargs=sample
    )
    converter.convert().export(str(folder / "model.tflite"))
    return _finish(folder, tiny_bert_dir, "tflite")


def _encode_one(tokenizer, text: str, length: int | None) -> dict[str, np.ndarray]:
    enc = tokenizer.encode(text)
    n = len(enc.ids)
    width = length or n
    ids, mask, types = (np.zeros((1, width), dtype=np.int64) for _ in range(3))
    ids[0, :n], mask[0, :n], types[0, :n] = enc.ids, 1, enc.type_ids
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def direct_logits(artifact: Path, texts: list[str]) -> np.ndarray:
    """One text at a time straight through the runtime, with the artifact's own tokenizer.json."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(artifact / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_LENGTH)
    if (artifact / "model.onnx").is_file():
        import onnxruntime as ort

        session = ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
        return np.concatenate([session.run(["logits"], _encode_one(tokenizer, t, None))[0] for t in texts])
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(artifact / "model.tflite")).get_signature_runner(f"seq_{MAX_LENGTH}")
    rows = []
    for text in texts:
        feeds = {k: v.astype(np.int32) for k, v in _encode_one(tokenizer, text, MAX_LENGTH).items()}
        rows.append(next(iter(runner(**feeds).values())))
    return np.concatenate(rows)


def teacher_logits(folder: Path, texts: list[str]) -> np.ndarray:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    with torch.no_grad():
        return np.concatenate([model(**tokenizer(t, return_tensors="pt")).logits.numpy() for t in texts])


def run_eval(*args: str) -> dict:
    @click.group(cls=Group)
    def cli() -> None:
        pass

    for command in COMMANDS:
        cli.add_command(command)
    result = CliRunner().invoke(cli, ["eval", *args, "--json", "out.json"])
    assert result.exit_code == 0, result.output
    return json.loads(Path("out.json").read_text())


def check_against_direct(artifact: Path, teacher: Path, data: Path, runtime: str) -> None:
    result = run_eval(str(artifact), "--data", str(data), "--text", "sentence", "--teacher", str(teacher))
    split = load_file(data, text="sentence", label="label", label_names=["l0", "l1"])
    mine, ref = direct_logits(artifact, split.texts), teacher_logits(teacher, split.texts)
    gold = np.array(split.labels)
    entry = result["artifacts"][0]
    m = entry["metrics"]
    assert m["accuracy"] == pytest.approx(float((mine.argmax(1) == gold).mean()))
    for idx, name in enumerate(["l0", "l1"]):
        assert m["per_class"][name] == {
            "support": int((gold == idx).sum()),
            "predicted": int((mine.argmax(1) == idx).sum()),
            "correct": int(((mine.argmax(1) == idx) & (gold == idx)).sum()),
        }
    assert m["agreement"] == pytest.approx(float((mine.argmax(1) == ref.argmax(1)).mean()))
    assert m["max_abs_logit_diff"] == pytest.approx(float(np.abs(mine - ref).max()), abs=1e-4)
    assert result["teacher"]["metrics"]["accuracy"] == pytest.approx(float((ref.argmax(1) == gold).mean()))
    model_file = artifact / ("model.onnx" if runtime == "onnxruntime" else "model.tflite")
    assert entry["bytes"] == model_file.stat().st_size
    assert entry["sha256"] == sha256_file(model_file)
    assert entry["measured"]["runtime"].startswith(runtime)
    assert entry["parameters"] > 10_000
    assert m["latency_ms"]["samples"] == 200 and m["peak_rss_bytes"] > 0
    # each request is timed in parts, for the artifact (through the runner) and the PyTorch teacher alike
    for latency in (m["latency_ms"], result["teacher"]["metrics"]["latency_ms"]):
        parts = latency["parts"]
        assert set(parts) == {"tokenize", "runtime", "postprocess"}
        assert all(part["p50"] >= 0 and part["mean"] >= 0 for part in parts.values())
        assert sum(part["mean"] for part in parts.values()) == pytest.approx(latency["mean"], rel=1e-6)
    # the artifact process never loads torch, so it peaks far below the teacher's process
    assert m["peak_rss_bytes"] < result["teacher"]["metrics"]["peak_rss_bytes"]


def test_eval_reproduces_onnxruntime_numbers(onnx_artifact, tiny_bert_dir, reviews):
    check_against_direct(onnx_artifact, tiny_bert_dir, reviews["test"], "onnxruntime")


def test_eval_scores_a_dynamic_int8_model_one_row_at_a_time_as_a_device_runs_it(
    onnx_artifact, tiny_bert_dir, reviews, tmp_path
):
    """ORT's dynamic int8 takes one activation scale per tensor: in a padded batch a row's logits
    depend on its batch-mates, so the report's numbers must be the row-at-a-time ones."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = tmp_path / "int8"
    folder.mkdir()
    quantize_dynamic(onnx_artifact / "model.onnx", folder / "model.onnx", weight_type=QuantType.QInt8)
    _finish(folder, tiny_bert_dir, "onnx")
    from compress.runtime.runner import load

    check_against_direct(folder, tiny_bert_dir, reviews["test"], "onnxruntime")
    result = run_eval(
        str(folder), "--data", str(reviews["test"]), "--text", "sentence", "--teacher", str(tiny_bert_dir)
    )
    entry = result["artifacts"][0]
    assert entry["measured"]["scored_batch_size"] == 1
    split = load_file(reviews["test"], text="sentence", label="label", label_names=["l0", "l1"])
    ref = teacher_logits(tiny_bert_dir, split.texts)
    row_by_row = direct_logits(folder, split.texts)
    batched = load(folder, threads=1).predict_logits(split.texts, batch_size=len(split.texts))
    one_batch_diff = float(np.abs(batched - ref).max())
    assert abs(one_batch_diff - float(np.abs(row_by_row - ref).max())) > 1e-6  # the batch does matter here
    assert entry["metrics"]["max_abs_logit_diff"] == pytest.approx(
        float(np.abs(row_by_row - ref).max()), abs=1e-7
    )


@pytest.mark.slow
def test_eval_reproduces_litert_numbers(tflite_artifact, tiny_bert_dir, reviews):
    check_against_direct(tflite_artifact, tiny_bert_dir, reviews["test"], "ai_edge_litert")


def test_eval_of_a_run_finds_its_teacher_and_artifacts(tmp_path, onnx_artifact, tiny_bert_dir, reviews):
    run = tmp_path / "runs" / "tiny"
    shutil.copytree(onnx_artifact, run / "02-export" / "tiny-onnx")
    write_json_atomic(
        run / "02-export" / "manifest.json", {"stage": "export", "produces": "artifacts", "complete": True}
    )
    recipe = tmp_path / "r.yaml"
    from tests.helpers.tiny import write_recipe

    write_recipe(
        recipe,
        teacher=tiny_bert_dir,
        data=reviews,
        stages="  - type: finetune\n",
        extra="evaluate: {latency_samples: 5, warmup: 1}",
    )
    write_json_atomic(
        run / "run.json",
        {
            "schema": "compress.run/1",
            "recipe": "tiny",
            "recipe_file": str(recipe),
            "teacher_dir": str(tiny_bert_dir),
            "stages": [{"index": 2, "type": "export", "dir": "02-export"}],
        },
    )
    result = run_eval(str(run), "--data", str(reviews["test"]), "--text", "sentence")
    assert result["teacher"]["path"] == str(tiny_bert_dir)
    assert [a["name"] for a in result["artifacts"]] == ["09-export/tiny-onnx"]
    assert result["artifacts"][0]["metrics"]["latency_ms"]["samples"] == 5
    assert "agreement" in result["artifacts"][0]["metrics"]


def test_eval_of_a_shared_checkpoint_keeps_its_ties(tmp_path, tiny_bert_dir, reviews):
    """A share-stage checkpoint stores tied weights once; loading it as a plain checkpoint would
    re-initialise the tied layers and the numbers would be those of a different model."""
    import torch

    from compress.models import count_parameters, load_classifier
    from compress.share.model import load_shared_classifier, save_shared_checkpoint, set_sharing_spec
    from compress.share.tying import encoder_layers, make_plan, tie_layers

    model, tokenizer = load_classifier(tiny_bert_dir)
    plan = make_plan("all", len(encoder_layers(model)))
    tie_layers(model, plan, init="mean")
    set_sharing_spec(model, layers=plan.to_json())
    save_shared_checkpoint(model, tokenizer, tmp_path / "shared")

    result = run_eval(
        str(tmp_path / "shared"),
        "--data",
        str(reviews["test"]),
        "--text",
        "sentence",
        "--teacher",
        str(tiny_bert_dir),
    )
    entry = result["checkpoints"][0]
    texts = load_file(reviews["test"], text="sentence", label="label", label_names=["l0", "l1"]).texts
    reloaded, _ = load_shared_classifier(tmp_path / "shared")
    with torch.no_grad():
        mine = np.concatenate([reloaded(**tokenizer(t, return_tensors="pt")).logits.numpy() for t in texts])
    ref = teacher_logits(tiny_bert_dir, texts)
    assert entry["metrics"]["max_abs_logit_diff"] == pytest.approx(float(np.abs(mine - ref).max()), abs=1e-4)
    assert entry["parameters"] == count_parameters(reloaded) < result["teacher"]["parameters"]
