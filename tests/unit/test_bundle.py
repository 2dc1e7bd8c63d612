"""Deploy bundles: the right artifact, every file hashed, only the runner's light dependencies inside."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from compress.bundle import make_bundle
from compress.errors import CompressError
from compress.io import file_entries, read_json, write_json_atomic
from tests.helpers.artifacts import cached_artifact
from tests.helpers.fallbacks import FALLBACK, with_fallback

DEVICE_IMPORTS = {"numpy", "tokenizers", "ai_edge_litert", "tflite_runtime", "onnxruntime"}
PROFILE = """name: tiny-board
format: {fmt}
runtime: {runtime}
threads: 3
sequence_lengths: [16, 32]
input_dtype: {dtype}
"""


@pytest.fixture(scope="module")
def artifacts(tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    scratch = tmp_path_factory.mktemp("artifacts")
    return {
        "onnx": cached_artifact(tiny_bert_dir, scratch, "onnx", [32]),
        "tflite": cached_artifact(tiny_bert_dir, scratch, "tflite", [16, 32]),
    }


def fake_run(root: Path, teacher: Path, artifacts: dict[str, Path], fmt: str, *, int8: bool = False) -> Path:
    """A finished run whose export stage holds the artifact (and optionally an int8 copy of it)."""
    stage = root / "02-export"
    stage.mkdir(parents=True)
    shutil.copytree(artifacts[fmt], stage / f"{fmt}-fp32")
    if int8:
        shutil.copytree(artifacts[fmt], stage / f"{fmt}-int8")
        manifest = read_json(stage / f"{fmt}-int8" / "manifest.json")
        manifest.update(name=f"02-export/{fmt}-int8", precision="int8")
        write_json_atomic(stage / f"{fmt}-int8" / "manifest.json", manifest)
    write_json_atomic(stage / "manifest.json", {"complete": True, "produces": "artifacts", "files": []})
    write_json_atomic(
        root / "run.json",
        {
            "recipe": "tiny",
            "teacher_dir": str(teacher),
            "stages": [{"index": 2, "type": "export", "dir": stage.name}],
        },
    )
    return root


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def write(fmt: str) -> str:
        folder = tmp_path / "targets"
        folder.mkdir(exist_ok=True)
        runtime, dtype = ("onnxruntime", "int64") if fmt == "onnx" else ("litert", "int32")
        (folder / "tiny-board.yaml").write_text(PROFILE.format(fmt=fmt, runtime=runtime, dtype=dtype))
        monkeypatch.setenv("COMPRESS_TARGETS", str(folder))
        return "tiny-board"

    return write


def unpack(bundle: Path, into: Path) -> Path:
    with tarfile.open(bundle) as tar:
        tar.extractall(into, filter="data")
    (folder,) = into.iterdir()
    return folder


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_bundle_holds_exactly_what_the_device_needs(artifacts, tiny_bert_dir, tmp_path, target, fmt):
    run = fake_run(tmp_path / "run", tiny_bert_dir, artifacts, fmt)
    info = make_bundle(run, target(fmt), tmp_path / "b.tar.gz")
    assert info["bytes"] == (tmp_path / "b.tar.gz").stat().st_size
    folder = unpack(tmp_path / "b.tar.gz", tmp_path / "unpacked")
    names = {p.name for p in folder.iterdir()}
    expected = {f"model.{fmt}", "tokenizer.json", "labels.json", "runner.py", "manifest.json", "README.txt"}
    expected |= {"README.md"}
    expected |= {"requirements.txt"}  # tflite-runtime's only for a model made for it (test below)
    assert names == expected
    manifest = read_json(folder / "manifest.json")
    assert manifest["files"] == file_entries(folder)
    assert manifest["threads"] == 3 and manifest["format"] == fmt


def test_runner_in_a_bundle_imports_no_torch_transformers_or_compress(
    artifacts, tiny_bert_dir, tmp_path, target
):
    run = fake_run(tmp_path / "run", tiny_bert_dir, artifacts, "tflite")
    folder = unpack(Path(make_bundle(run, target("tflite"), tmp_path / "b.tar.gz")["path"]), tmp_path / "u")
    tree = ast.parse((folder / "runner.py").read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0
    }
    third_party = imported - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party <= DEVICE_IMPORTS
    script = (
        "import sys, runner; r = runner.load('.'); r.predict(['good phone']); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'compress'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=folder, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_bundle_prefers_int8(artifacts, tiny_bert_dir, tmp_path, target):
    run = fake_run(tmp_path / "run", tiny_bert_dir, artifacts, "tflite", int8=True)
    info = make_bundle(run, target("tflite"), tmp_path / "b.tar.gz")
    assert info["artifact"] == "02-export/tflite-int8" and info["precision"] == "int8"


def test_unpacked_bundle_runs_and_refuses_a_changed_file(artifacts, tiny_bert_dir, tmp_path, target):
    run = fake_run(tmp_path / "run", tiny_bert_dir, artifacts, "tflite")
    folder = unpack(Path(make_bundle(run, target("tflite"))["path"]), tmp_path / "u")
    command = [sys.executable, str(folder / "runner.py"), "predict", "good phone"]
    ok = subprocess.run(command, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["label"] in read_json(folder / "labels.json")
    (folder / "tokenizer.json").write_text((folder / "tokenizer.json").read_text().replace("good", "goad"))
    refused = subprocess.run(command, capture_output=True, text=True)
    assert refused.returncode == 2
    assert "tokenizer.json: sha256 differs from manifest.json" in refused.stderr


def test_same_run_gives_the_same_bundle_bytes(artifacts, tiny_bert_dir, tmp_path, target):
    run = fake_run(tmp_path / "run", tiny_bert_dir, artifacts, "onnx")
    first = make_bundle(run, target("onnx"), tmp_path / "a.tar.gz")
    second = make_bundle(run, target("onnx"), tmp_path / "b.tar.gz")
    assert first["sha256"] == second["sha256"]


def test_changed_artifact_is_not_bundled(artifacts, tiny_bert_dir, tmp_path, target):
    run = fake_run(tmp_path / "run", tiny_bert_dir, artifacts, "onnx")
    (run / "02-export" / "onnx-fp32" / "labels.json").write_text('["x", "y"]')
    with pytest.raises(CompressError, match=r"labels\.json: missing or changed since export"):
        make_bundle(run, target("onnx"), tmp_path / "b.tar.gz")
    assert not (tmp_path / "b.tar.gz").exists()


def test_missing_target_names_what_the_run_made(artifacts, tiny_bert_dir, tmp_path, target, monkeypatch):
    run = fake_run(tmp_path / "run", tiny_bert_dir, artifacts, "onnx")
    target("onnx")
    (tmp_path / "targets" / "other-board.yaml").write_text(
        PROFILE.replace("tiny-board", "other-board").format(fmt="onnx", runtime="onnxruntime", dtype="int64")
    )
    with pytest.raises(
        CompressError, match=r"no artifact for target 'other-board' \(this run made: tiny-board\)"
    ):
        make_bundle(run, "other-board", tmp_path / "b.tar.gz")


def named_for(artifact: Path, into: Path, interpreters: list[str]) -> Path:
    """A copy of ``artifact`` whose runtime contract names ``interpreters`` for model.tflite, as export
    and quantize write it for a target (a Pi's fp32 model: both; a phone's or a Pi's dynamic int8: LiteRT)."""
    folder = Path(shutil.copytree(artifact, into))
    manifest = read_json(folder / "manifest.json")
    loaded = [
        {"interpreter": name, "loaded": None, "note": "not installed on this host"} for name in interpreters
    ]
    manifest["runtime"] = {"ops": [], "loaded_at_export": loaded}
    write_json_atomic(folder / "manifest.json", manifest)
    return folder


@pytest.mark.parametrize(
    ("made_for", "offered"),
    [
        ("fallback", True),  # a Pi's dynamic int8: model.tflite for LiteRT, a weight-only one for 2.14
        (["ai_edge_litert", "tflite_runtime"], True),  # a Pi's fp32 or weight-only model: both run it
        (["ai_edge_litert"], False),  # a phone's: the app links LiteRT; 2.14 computes its int8 wrongly
        (None, False),  # no runtime contract (an artifact from before compress kept them): nothing is known
    ],
)
def test_a_tflite_bundle_offers_tflite_runtime_only_for_a_model_made_for_it(
    artifacts, tiny_bert_dir, tmp_path, target, made_for, offered
):
    if made_for == "fallback":
        artifact = with_fallback(artifacts["tflite"], tmp_path / "artifact")
    elif made_for is not None:
        artifact = named_for(artifacts["tflite"], tmp_path / "artifact", made_for)
    else:
        artifact = artifacts["tflite"]
    run = fake_run(tmp_path / "run", tiny_bert_dir, {"tflite": artifact}, "tflite")
    folder = unpack(Path(make_bundle(run, target("tflite"), tmp_path / "b.tar.gz")["path"]), tmp_path / "u")
    assert (folder / "requirements.txt").read_text().startswith("ai-edge-litert")
    requirements = folder / "requirements-tflite-runtime.txt"
    assert requirements.is_file() == offered
    readme = (folder / "README.txt").read_text()
    assert ("pip install -r requirements-tflite-runtime.txt" in readme) == offered
    assert ("tflite-runtime is not offered" in readme) == (not offered)
    if offered:
        assert requirements.read_text().split() == ["tflite-runtime==2.14.0", "numpy<2", "tokenizers>=0.19"]


def test_bundle_command_reports_the_size(artifacts, tiny_bert_dir, tmp_path, target):
    from click.testing import CliRunner

    from compress.cli_deploy import bundle_cmd

    run = fake_run(tmp_path / "run", tiny_bert_dir, artifacts, "onnx")
    out = tmp_path / "pi.tar.gz"
    result = CliRunner().invoke(bundle_cmd, [str(run), "--target", target("onnx"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith(f"{out}: ") and "onnx fp32, for tiny-board)" in first
    assert "model.onnx" in result.output


def _card(folder: Path) -> tuple[dict, str]:
    import yaml

    text = (folder / "README.md").read_text()
    assert text.startswith("---\n")
    header, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(header), body


def test_bundle_carries_a_model_card_with_the_reports_numbers_for_this_model(
    artifacts, tiny_bert_dir, tmp_path, target
):
    run = fake_run(tmp_path / "run", tiny_bert_dir, artifacts, "onnx")
    name = read_json(run / "02-export" / "onnx-fp32" / "manifest.json")["name"]
    sha = next(
        f["sha256"] for f in file_entries(run / "02-export" / "onnx-fp32") if f["path"] == "model.onnx"
    )
    entry = {
        "name": name,
        "role": "artifact",
        "format": "onnx",
        "bytes": 2_500_000,
        "sha256": sha,
        "metrics": {"accuracy": 0.8125, "agreement": 0.9375, "latency_ms": {"p50": 1.25}},
    }
    teacher = {
        "name": "teacher",
        "role": "teacher",
        "format": "torch",
        "precision": "fp32",
        "bytes": 9_000_000,
        "metrics": {"accuracy": 0.875, "latency_ms": {"p50": 4.5}},
    }
    report = {
        "schema": "compress.report/1",
        "artifacts": [entry],
        "teacher": teacher,
        "split": "test",
        "data": {"source": "data/reviews.tsv", "rows": 16},
        "host": {"machine": "x86_64", "cpus": 2},
    }
    write_json_atomic(run / "report.json", report)
    folder = unpack(Path(make_bundle(run, target("onnx"), tmp_path / "b.tar.gz")["path"]), tmp_path / "u")
    meta, body = _card(folder)
    assert meta["pipeline_tag"] == "text-classification" and meta["labels"] == read_json(
        folder / "labels.json"
    )
    assert meta["datasets"] == ["reviews.tsv"]
    metrics = meta["model-index"][0]["results"][0]["metrics"]
    assert {"type": "accuracy", "value": 0.8125} in metrics and {
        "type": "agreement",
        "value": 0.9375,
    } in metrics
    assert "| this model | 81.25 | 93.75 | 1.25 | 2.5 |" in body and "| 87.50 | 100.00 | 4.50 | 9.0 |" in body
    assert "runner.py predict" in body
    # numbers measured on another file never reach the card
    entry["sha256"] = "0" * 64
    write_json_atomic(run / "report.json", report)
    folder = unpack(Path(make_bundle(run, target("onnx"), tmp_path / "c.tar.gz")["path"]), tmp_path / "v")
    meta, body = _card(folder)
    assert "model-index" not in meta and "81.25" not in body and "No report of the run measured" in body


def run_with_fallback(root: Path, teacher: Path, artifacts: dict[str, Path], **entry) -> Path:
    run = fake_run(root, teacher, artifacts, "tflite")
    folder = with_fallback(artifacts["tflite"], run / "02-export" / "tflite-int8", **entry)
    manifest = read_json(folder / "manifest.json")
    manifest.update(
        name="02-export/tflite-int8", precision="int8", runtime={"ops": [{"op": "ADD", "version": 1}]}
    )
    write_json_atomic(folder / "manifest.json", manifest)
    return run


def test_a_tflite_bundle_carries_the_fallback_model_and_says_which_interpreter_runs_it(
    artifacts, tiny_bert_dir, tmp_path, target
):
    run = run_with_fallback(tmp_path / "run", tiny_bert_dir, artifacts)
    folder = unpack(Path(make_bundle(run, target("tflite"), tmp_path / "b.tar.gz")["path"]), tmp_path / "u")
    manifest = read_json(folder / "manifest.json")
    assert {"model.tflite", FALLBACK} <= {entry["path"] for entry in manifest["files"]}
    assert manifest["fallbacks"][0]["path"] == FALLBACK and manifest["fallbacks"][0]["below"] == "2.15"
    assert manifest["runtime"] == {"ops": [{"op": "ADD", "version": 1}]}
    assert f"runs {FALLBACK} (weight-only) under tflite_runtime < 2.15" in (folder / "README.txt").read_text()
    done = subprocess.run(
        [sys.executable, str(folder / "runner.py"), "predict", "good phone"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "ran model.tflite, its primary model" in done.stderr


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"path": "other.tflite"}, r"fallback model 'other\.tflite' is not listed in files"),
        ({"path": "../x.tflite"}, r"'\.\./x\.tflite' leaves its folder"),
        (
            {"interpreter": "tensorflow"},
            r"fallbacks\[0\]\.interpreter: input should be .ai_edge_litert. or .tflite_runtime.",
        ),
    ],
)
def test_a_fallback_outside_the_artifact_or_unlisted_is_not_bundled(
    artifacts, tiny_bert_dir, tmp_path, target, entry, message
):
    run = run_with_fallback(tmp_path / "run", tiny_bert_dir, artifacts, **entry)
    with pytest.raises(CompressError, match=message) as info:
        make_bundle(run, target("tflite"), tmp_path / "b.tar.gz")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "b.tar.gz").exists()


def test_a_changed_fallback_model_is_not_bundled(artifacts, tiny_bert_dir, tmp_path, target):
    run = run_with_fallback(tmp_path / "run", tiny_bert_dir, artifacts)
    (run / "02-export" / "tflite-int8" / FALLBACK).write_bytes(b"TFL3 changed")
    with pytest.raises(CompressError, match=rf"{FALLBACK}: missing or changed since export"):
        make_bundle(run, target("tflite"), tmp_path / "b.tar.gz")
