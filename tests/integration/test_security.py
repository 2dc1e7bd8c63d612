"""Unsafe files: compress runs no code it is handed unless the recipe says so, and writes only its run folder.

Each test plants something that would leave a marker file if it ran (a model class, a pickle, a
YAML tag) and checks that the marker is absent by default, and, where the recipe can opt in, that
opting in is what makes it run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from compress.io import sha256_file
from tests.helpers.tiny import write_recipe

COPY = "  - type: finetune\n    epochs: 1\n"
DISTILL = "  - type: distill\n    layers: 1\n    epochs: 1\n    batch_size: 32\n"
QUICK_REPORT = "evaluate: {latency_samples: 3, warmup: 0, throughput_batch: 4}\n"


def compress_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "compress.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )


def one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    return errors[0]


REMOTE_CODE = """
from pathlib import Path
from transformers import BertConfig, BertForSequenceClassification

Path({marker!r}).write_text("remote code ran")


class EvilConfig(BertConfig):
    model_type = "evil-bert"


class EvilBertForSequenceClassification(BertForSequenceClassification):
    config_class = EvilConfig
"""


def remote_code_teacher(tiny: Path, folder: Path, marker: Path) -> Path:
    """The tiny teacher whose config asks for a model class from a Python file in the folder."""
    shutil.copytree(tiny, folder)
    (folder / "modeling_evil.py").write_text(REMOTE_CODE.format(marker=str(marker)))
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="evil-bert",
        architectures=["EvilBertForSequenceClassification"],
        auto_map={
            "AutoConfig": "modeling_evil.EvilConfig",
            "AutoModelForSequenceClassification": "modeling_evil.EvilBertForSequenceClassification",
        },
    )
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_remote_code_runs_only_when_the_recipe_opts_in(tmp_path, tiny_bert_dir, reviews):
    marker = tmp_path / "REMOTE_CODE_RAN"
    teacher = remote_code_teacher(tiny_bert_dir, tmp_path / "teacher", marker)
    env = {"HF_MODULES_CACHE": str(tmp_path / "modules")}
    path = write_recipe(tmp_path / "r.yaml", teacher=teacher, data=reviews, stages=DISTILL)
    line = one_error_line(compress_cli("run", str(path), "--out", str(tmp_path / "runs"), env=env))
    assert not marker.exists(), "the teacher's Python file ran without trust_remote_code"
    assert "teacher" in line or str(teacher) in line
    trusted = path.read_text().replace(
        f"teacher: {{path: {teacher}}}", f"teacher: {{path: {teacher}, trust_remote_code: true}}"
    )
    path.write_text(trusted)
    compress_cli("run", str(path), "--out", str(tmp_path / "runs"), env=env)
    assert marker.exists(), "trust_remote_code: true should load the teacher's own model class"


class _Payload:
    """Unpickling this creates a file: proof that a pickle was loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "pickle ran"))


def pickle_teacher(tiny: Path, folder: Path, marker: Path | None) -> Path:
    import pickle

    import torch
    from safetensors.torch import load_file

    shutil.copytree(tiny, folder)
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    if marker is None:
        torch.save(state, folder / "pytorch_model.bin")
    else:
        (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    return folder


def test_pickle_only_teacher_is_never_unpickled_by_default(tmp_path, tiny_bert_dir, reviews):
    marker = tmp_path / "PICKLE_RAN"
    teacher = pickle_teacher(tiny_bert_dir, tmp_path / "teacher", marker)
    path = write_recipe(tmp_path / "r.yaml", teacher=teacher, data=reviews, stages=DISTILL)
    line = one_error_line(compress_cli("run", str(path), "--out", str(tmp_path / "runs")))
    assert "allow_pickle: true" in line
    assert not marker.exists()


@pytest.mark.parametrize("stages", [COPY + DISTILL, DISTILL], ids=["finetune-copies", "teacher-as-is"])
def test_pickle_teacher_runs_end_to_end_when_the_recipe_opts_in(tmp_path, tiny_bert_dir, reviews, stages):
    teacher = pickle_teacher(tiny_bert_dir, tmp_path / "teacher", None)
    path = write_recipe(tmp_path / "r.yaml", teacher=teacher, data=reviews, stages=stages, extra=QUICK_REPORT)
    path.write_text(path.read_text().replace(f"path: {teacher}}}", f"path: {teacher}, allow_pickle: true}}"))
    done = compress_cli("run", str(path), "--out", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "tiny"
    for folder in (p for p in run.iterdir() if p.is_dir() and p.name[:2].isdigit()):
        # unpickled once by the stage that reads the teacher; every checkpoint written is safetensors
        assert (folder / "model.safetensors").is_file() and not (folder / "pytorch_model.bin").exists()
    report = json.loads((run / "report.json").read_text())
    assert report["teacher"]["metrics"]["accuracy"] is not None


@pytest.mark.parametrize("command", ["validate", "run"])
def test_yaml_tags_are_rejected_not_executed(tmp_path, command):
    marker = tmp_path / "YAML_RAN"
    path = tmp_path / "r.yaml"
    path.write_text(f'name: !!python/object/apply:os.system ["touch {marker}"]\n')
    extra = ["--out", str(tmp_path / "runs")] if command == "run" else []
    line = one_error_line(compress_cli(command, str(path), *extra))
    assert "not allowed" in line and f"{path}:1" in line
    assert not marker.exists() and not (tmp_path / "runs").exists()


def test_target_profile_tags_are_rejected_not_executed(tmp_path):
    marker = tmp_path / "YAML_RAN"
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "evil.yaml").write_text(
        f'name: evil\ndescription: !!python/object/apply:os.system ["touch {marker}"]\n'
    )
    line = one_error_line(compress_cli("targets", env={"COMPRESS_TARGETS": str(tmp_path / "targets")}))
    assert "evil.yaml:2" in line and "not allowed" in line
    assert not marker.exists()


@pytest.mark.parametrize(
    "name", ["../escape", "../../tmp/escape", "/tmp/escape", "a/../../b", "..", ".hidden", "x\ny"]
)
def test_recipe_name_cannot_leave_the_out_folder(tmp_path, tiny_bert_dir, reviews, name):
    path = write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=COPY)
    done = compress_cli(
        "run", str(path), "--out", str(tmp_path / "runs"), "--set", f"name={json.dumps(name)}"
    )
    line = one_error_line(done)
    assert "name:" in line and "run folder" in line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "escape").exists()


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_run_writes_only_inside_its_run_folder(tmp_path, tiny_bert_dir, reviews):
    """Relative paths with ../ in the recipe are read, never written; teacher and data stay unchanged."""
    work = tmp_path / "work"
    (work / "recipes").mkdir(parents=True)
    teacher = shutil.copytree(tiny_bert_dir, tmp_path / "teacher")
    path = write_recipe(
        work / "recipes" / "r.yaml",
        teacher=Path("../../teacher"),
        data=reviews,
        stages=COPY,
        extra=QUICK_REPORT,
    )
    text = path.read_text()
    for file in reviews.values():
        text = text.replace(str(file), f"../../data/{file.name}")
    path.write_text(text)
    before = tree(tmp_path)
    done = compress_cli("run", str(path), "--out", str(work / "runs"))
    assert done.returncode == 0, done.stderr[-3000:]
    after = tree(tmp_path)
    changed = {name for name in after if before.get(name) != after[name]}
    assert changed and all(name.startswith("work/runs/tiny/") for name in changed), sorted(changed)
    assert all(after.get(name) == digest for name, digest in before.items())
    assert tree(teacher) == tree(tiny_bert_dir)


def bundle_folder(tmp_path: Path, tiny: Path) -> Path:
    from compress.bundle import bundle_files, write_tar
    from tests.helpers.artifacts import make_artifact

    artifact = make_artifact(tiny, tmp_path / "artifact", "onnx", [16])
    write_tar(tmp_path / "b.tar.gz", "b", bundle_files(artifact, 1, "b.tar.gz"), 0)
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    return tmp_path / "unpacked" / "b"


def refuse_sessions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record any attempt to open a model file with onnxruntime."""
    import onnxruntime

    opened: list[str] = []

    def session(path, *args, **kwargs):
        opened.append(str(path))
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    return opened


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda b: (b / "model.onnx").write_bytes(b"not a model"), id="model-replaced"),
        pytest.param(lambda b: (b / "tokenizer.json").write_text("{}"), id="tokenizer-replaced"),
        pytest.param(lambda b: (b / "labels.json").write_text('["a", "b"]'), id="labels-replaced"),
        pytest.param(lambda b: (b / "model.onnx").unlink(), id="model-missing"),
        pytest.param(
            lambda b: (b / "manifest.json").write_text(
                (b / "manifest.json").read_text().replace('"path": "model.onnx"', '"path": "../model.onnx"')
            ),
            id="manifest-path-escapes",
        ),
    ],
)
def test_bundle_manifest_is_checked_before_the_model_loads(tmp_path, tiny_bert_dir, monkeypatch, tamper):
    from compress.runtime.runner import RunnerError, load

    folder = bundle_folder(tmp_path, tiny_bert_dir)
    tamper(folder)
    opened = refuse_sessions(monkeypatch)
    with pytest.raises(RunnerError) as info:
        load(folder)
    assert opened == [] and "\n" not in str(info.value)


def test_untouched_bundle_loads_and_predicts(tmp_path, tiny_bert_dir):
    from compress.runtime.runner import load

    runner = load(bundle_folder(tmp_path, tiny_bert_dir))
    assert runner.predict("a good film")[0]["label"] in ("l0", "l1")
