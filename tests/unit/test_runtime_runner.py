"""The on-device runner: same answers as torch, safe input handling, manifest check, interpreter fallback."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from compress.runtime import runner as rt
from tests.helpers.artifacts import cached_artifact
from tests.helpers.fallbacks import FALLBACK, with_fallback

TEXTS = ["the phone was really good", "awful service and rude staff", "a bland meal"]


@pytest.fixture(scope="module")
def artifacts(tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    scratch = tmp_path_factory.mktemp("artifacts")
    return {
        "onnx": cached_artifact(tiny_bert_dir, scratch, "onnx", [32]),
        "tflite": cached_artifact(tiny_bert_dir, scratch, "tflite", [16, 32]),
    }


@pytest.fixture
def tflite_copy(artifacts: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(artifacts["tflite"], tmp_path / "tflite"))


def torch_logits(checkpoint: Path, texts: list[str], max_length: int) -> np.ndarray:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    model = AutoModelForSequenceClassification.from_pretrained(str(checkpoint)).eval()
    with torch.no_grad():
        rows = [
            model(**tokenizer(t, truncation=True, max_length=max_length, return_tensors="pt")).logits
            for t in texts
        ]
    return torch.cat(rows).numpy()


@pytest.mark.parametrize("fmt", ["onnx", "tflite"])
def test_runner_matches_torch(artifacts: dict[str, Path], tiny_bert_dir: Path, fmt: str):
    runner = rt.load(artifacts[fmt])
    expected = torch_logits(tiny_bert_dir, TEXTS, 32)
    np.testing.assert_allclose(runner.predict_logits(TEXTS, batch_size=2), expected, atol=1e-4)
    predictions = runner.predict(TEXTS)
    assert [p["label"] for p in predictions] == [runner.labels[i] for i in expected.argmax(axis=1)]
    assert all(0.0 < p["score"] <= 1.0 for p in predictions)


def test_tflite_uses_smallest_signature_that_fits(artifacts: dict[str, Path]):
    runner = rt.load(artifacts["tflite"])
    assert runner.session.lengths == [16, 32]
    assert runner.benchmark(["good phone"], warmup=0, runs=1)["padded_to"] == [16]
    assert runner.benchmark([" ".join(["good"] * 20)], warmup=0, runs=1)["padded_to"] == [32]


@pytest.mark.parametrize("fmt", ["onnx", "tflite"])
def test_over_long_text_is_truncated_to_max_length(artifacts: dict[str, Path], fmt: str):
    runner = rt.load(artifacts[fmt])
    words = ["good", "phone", "bad", "staff"] * 50
    long_logits = runner.predict_logits([" ".join(words)])
    cut_logits = runner.predict_logits([" ".join(words[:30])])  # 30 words + [CLS] + [SEP] = 32 tokens
    np.testing.assert_allclose(long_logits, cut_logits, atol=1e-5)


@pytest.mark.parametrize("text", ["", "   ", "\n"])
def test_empty_text_is_an_error(artifacts: dict[str, Path], text: str):
    with pytest.raises(rt.RunnerError, match="empty text"):
        rt.load(artifacts["onnx"]).predict(["good", text])


def test_blank_line_in_a_file_names_the_line(artifacts: dict[str, Path], tmp_path: Path):
    path = tmp_path / "in.txt"
    path.write_text("good phone\n\nbad phone\n")
    with pytest.raises(rt.RunnerError, match=r"in.txt:2: empty text"):
        rt.read_inputs(path)


def test_non_utf8_file_is_an_error(tmp_path: Path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"good phone\ncaf\xe9 latte\n")
    with pytest.raises(rt.RunnerError, match=r"in.txt:2: not valid UTF-8"):
        rt.read_inputs(path)


def test_non_utf8_argument_is_an_error(artifacts: dict[str, Path], capsys: pytest.CaptureFixture[str]):
    undecodable = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python passes such argv bytes
    assert rt.main(["--dir", str(artifacts["onnx"]), "predict", undecodable]) == 2
    assert "not valid UTF-8" in capsys.readouterr().err


def test_tampered_model_is_refused_before_loading(tflite_copy: Path, monkeypatch: pytest.MonkeyPatch):
    model = tflite_copy / "model.tflite"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))

    def never(*_args, **_kwargs):
        raise AssertionError("the interpreter was reached before the manifest check")

    monkeypatch.setattr(rt, "tflite_interpreter", never)
    with pytest.raises(rt.RunnerError, match=r"model.tflite: sha256 differs from manifest.json") as info:
        rt.load(tflite_copy)
    assert "\n" not in str(info.value)


def test_unlisted_model_is_refused(tflite_copy: Path):
    manifest = json.loads((tflite_copy / "manifest.json").read_text())
    manifest["files"] = [f for f in manifest["files"] if f["path"] != "model.tflite"]
    (tflite_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(rt.RunnerError, match=r"does not list model\.tflite"):
        rt.load(tflite_copy)


def test_ai_edge_litert_is_preferred(artifacts: dict[str, Path]):
    assert rt.load(artifacts["tflite"]).session.interpreter == "ai_edge_litert"


def test_tflite_runtime_is_the_fallback(artifacts: dict[str, Path], monkeypatch: pytest.MonkeyPatch):
    from ai_edge_litert.interpreter import Interpreter

    expected = rt.load(artifacts["tflite"]).predict_logits(TEXTS)
    fake = types.ModuleType("tflite_runtime.interpreter")
    fake.Interpreter = Interpreter
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    monkeypatch.setitem(sys.modules, "tflite_runtime", types.ModuleType("tflite_runtime"))
    monkeypatch.setitem(sys.modules, "tflite_runtime.interpreter", fake)
    runner = rt.load(artifacts["tflite"])
    assert runner.session.interpreter == "tflite_runtime"
    np.testing.assert_allclose(runner.predict_logits(TEXTS), expected, atol=1e-6)


def test_no_interpreter_says_what_to_install(artifacts: dict[str, Path], monkeypatch: pytest.MonkeyPatch):
    for name in (
        "ai_edge_litert",
        "ai_edge_litert.interpreter",
        "tflite_runtime",
        "tflite_runtime.interpreter",
    ):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(rt.RunnerError, match=r"pip install ai-edge-litert .*tflite-runtime==2.14.0"):
        rt.load(artifacts["tflite"])


@pytest.mark.parametrize(
    ("name", "content", "lines"),
    [
        ("in.txt", "good phone\nbad staff\n", 2),
        ("in.tsv", "good phone\nbad staff\nfine\n", 3),
        ("in.jsonl", '{"text": "good phone"}\n{"text": "bad staff"}\n', 2),
    ],
)
def test_predict_file_writes_json_lines(artifacts: dict[str, Path], tmp_path: Path, name, content, lines):
    source, out = tmp_path / name, tmp_path / "out.jsonl"
    source.write_text(content)
    assert (
        rt.main(["--dir", str(artifacts["tflite"]), "predict", "--file", str(source), "--out", str(out)]) == 0
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["line"] for r in rows] == list(range(1, lines + 1))
    assert {"label", "score", "logits"} <= set(rows[0])


def test_pairs_given_to_a_single_text_model_are_an_error(artifacts: dict[str, Path], tmp_path: Path):
    source = tmp_path / "in.tsv"
    source.write_text("good phone\tbad phone\n")
    texts, pairs = rt.read_inputs(source)
    with pytest.raises(rt.RunnerError, match="single texts"):
        rt.load(artifacts["onnx"]).predict(texts, pairs)


def test_benchmark_writes_the_device_results_format(artifacts: dict[str, Path], tmp_path: Path):
    out = tmp_path / "device.json"
    assert rt.main(["--dir", str(artifacts["tflite"]), "benchmark", "--runs", "3", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["schema"] == rt.BENCHMARK_SCHEMA
    assert result["model_sha256"] == rt.sha256_file(artifacts["tflite"] / "model.tflite")
    assert result["runs"] == 3 and result["padded_to"] == [32]
    assert set(result["latency_ms"]) == {"p50", "p90", "p99", "mean", "min", "max"}
    assert result["interpreter"]["name"] == "ai_edge_litert"
    assert {"machine", "cpu_model", "cpu_count"} <= set(result["device"])


def fake_tflite_runtime(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """Only tflite_runtime ``version`` is installed (LiteRT's Interpreter class under its name)."""
    from ai_edge_litert.interpreter import Interpreter

    fake = types.ModuleType("tflite_runtime.interpreter")
    fake.Interpreter = Interpreter
    package = types.ModuleType("tflite_runtime")
    package.__version__ = version
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    monkeypatch.setitem(sys.modules, "tflite_runtime", package)
    monkeypatch.setitem(sys.modules, "tflite_runtime.interpreter", fake)


@pytest.mark.parametrize(
    ("installed", "expected"),
    [("2.14.0", FALLBACK), ("2.13.1", FALLBACK), ("2.15.0", "model.tflite"), (None, "model.tflite")],
)
def test_the_runner_picks_the_model_its_interpreter_runs_correctly_and_says_which(
    artifacts, tmp_path, monkeypatch, capsys, installed, expected
):
    folder = with_fallback(artifacts["tflite"], tmp_path / "pi")
    if installed is not None:
        fake_tflite_runtime(monkeypatch, installed)
    runner = rt.load(folder)
    assert runner.model.name == expected and runner.describe()["model"] == expected
    assert rt.main(["--dir", str(folder), "predict", "good phone"]) == 0
    said = capsys.readouterr().err.strip()
    interpreter = "tflite_runtime" if installed else "ai_edge_litert"
    assert said.startswith(f"runner: {interpreter} {installed or ''}".rstrip() + " ")
    assert f"ran {expected}, " in said
    assert ("computes dynamic int8 wrongly" in said) == (expected == FALLBACK)


def test_an_unreadable_tflite_runtime_version_takes_the_fallback(artifacts, tmp_path, monkeypatch):
    folder = with_fallback(artifacts["tflite"], tmp_path / "pi")
    fake_tflite_runtime(monkeypatch, "unknown")
    assert rt.load(folder).model.name == FALLBACK


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"path": "../fallback.tflite"},
            r"fallbacks\[0\]: model path '\.\./fallback\.tflite' is not a \.tflite file inside",
        ),
        ({"path": "/tmp/fallback.tflite"}, r"is not a \.tflite file inside the folder; refusing it"),
        ({"path": "labels.json"}, r"'labels\.json' is not a \.tflite file inside"),
        ({"path": "other.tflite"}, r"'other\.tflite' is not listed in 'files'"),
        ({"below": "newest"}, r"'below' must be a version"),
        ({"interpreter": "tensorflow"}, r"'interpreter' must be one of"),
    ],
)
def test_a_fallback_outside_the_folder_or_unlisted_is_refused_in_one_line(
    artifacts, tmp_path, entry, message
):
    folder = with_fallback(artifacts["tflite"], tmp_path / "pi", **entry)
    with pytest.raises(rt.RunnerError, match=message) as info:
        rt.load(folder)
    assert "\n" not in str(info.value)


def test_a_changed_fallback_model_is_refused_before_any_interpreter_loads(artifacts, tmp_path, monkeypatch):
    folder = with_fallback(artifacts["tflite"], tmp_path / "pi")
    data = bytearray((folder / FALLBACK).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / FALLBACK).write_bytes(bytes(data))
    monkeypatch.setattr(rt, "tflite_interpreter", lambda: pytest.fail("an interpreter was loaded"))
    with pytest.raises(rt.RunnerError, match=rf"{FALLBACK}: sha256 differs from manifest\.json") as info:
        rt.load(folder)
    assert "\n" not in str(info.value)


def test_a_named_model_runs_whatever_the_interpreter_would_pick(artifacts, tmp_path):
    folder = with_fallback(artifacts["tflite"], tmp_path / "pi")
    assert rt.load(folder, model=FALLBACK).model.name == FALLBACK
    with pytest.raises(rt.RunnerError, match=r"no model 'x\.tflite'; it lists \['model\.tflite', "):
        rt.load(folder, model="x.tflite")


def test_the_reason_a_manifest_gives_reaches_the_terminal_without_control_characters(
    artifacts, tmp_path, monkeypatch
):
    folder = with_fallback(
        artifacts["tflite"], tmp_path / "pi", reason="old kernels\x1b[2J\x07 round\rdifferently"
    )
    fake_tflite_runtime(monkeypatch, "2.14.0")
    why = rt.load(folder).why
    assert why.endswith("old kernels[2J rounddifferently") and why.isprintable()


@pytest.mark.parametrize(
    ("named", "installed", "warned"),
    [
        (["ai_edge_litert"], None, False),  # a phone's model under the interpreter it was made for
        (["ai_edge_litert"], "2.14.0", True),  # ... under tflite-runtime 2.14, which computes it wrongly
        (["ai_edge_litert", "tflite_runtime"], "2.14.0", False),  # a Pi's fp32 model: made for both
        (None, "2.14.0", False),  # no runtime contract (an older artifact): nothing to say
    ],
)
def test_an_interpreter_the_model_was_not_made_for_runs_it_with_a_warning(
    artifacts, tmp_path, monkeypatch, capsys, named, installed, warned
):
    folder = Path(shutil.copytree(artifacts["tflite"], tmp_path / "phone"))
    if named is not None:
        manifest = json.loads((folder / "manifest.json").read_text())
        loaded = [{"interpreter": name, "loaded": None} for name in named]
        manifest["runtime"] = {"ops": [], "loaded_at_export": loaded}
        (folder / "manifest.json").write_text(json.dumps(manifest))
    if installed is not None:
        fake_tflite_runtime(monkeypatch, installed)
    assert rt.main(["--dir", str(folder), "predict", "good phone"]) == 0
    said = capsys.readouterr().err
    assert said.startswith(f"runner: {'tflite_runtime' if installed else 'ai_edge_litert'} ")
    warning = (
        "WARNING: made for ai_edge_litert, not tflite_runtime, whose labels may be wrong "
        "(pip install ai-edge-litert)"
    )
    assert (warning in said) == warned and ("WARNING" in said) == warned, said


def test_one_request_encodes_as_its_batch_would(artifacts: dict[str, Path]):
    encoder = rt.Encoder(artifacts["onnx"] / "tokenizer.json", 12)
    texts = [*TEXTS, "word " * 40]  # the last one is truncated
    batch = encoder.encode(texts, None)
    assert [encoder.encode([text], None)[0] for text in texts] == batch
    assert len(batch[-1][0]) == 12
    pairs = ["second text", "another one", "x", "y"]
    batch = encoder.encode(texts, pairs)
    assert [encoder.encode([t], [p])[0] for t, p in zip(texts, pairs, strict=True)] == batch
    assert any(1 in type_ids for _, type_ids in batch)  # the second segment is marked
