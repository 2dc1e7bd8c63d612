"""The backbone end to end on a tiny model: finetune, run folders, caching, resume after kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from compress.io import read_json, sha256_file
from compress.pipeline import run_lock, run_recipe
from compress.recipe import load_recipe
from tests.helpers.tiny import write_recipe

FINETUNE = "  - type: finetune\n    when: always\n    epochs: {epochs}\n    batch_size: 16\n    lr: 3.0e-3\n"


def compress_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "compress.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def test_finetune_learns_the_task_and_writes_a_manifest(tmp_path, tiny_bert_dir, reviews):
    recipe = load_recipe(
        write_recipe(
            tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=FINETUNE.format(epochs=10)
        )
    )
    result = run_recipe(recipe, tmp_path / "runs")
    stage = result.stages[0]
    manifest = read_json(stage.dir / "manifest.json")
    assert stage.dir.name == "01-finetune" and manifest["complete"] is True
    assert manifest["metrics"]["eval_accuracy"] >= 0.8, manifest["metrics"]["history"]
    for entry in manifest["files"]:
        assert sha256_file(stage.dir / entry["path"]) == entry["sha256"]
    assert (stage.dir / "model.safetensors").is_file()
    config = json.loads((stage.dir / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert not list(result.run_dir.glob(".*tmp*"))


def test_rerun_reuses_finished_stages_and_fresh_does_not(tmp_path, tiny_bert_dir, reviews):
    recipe = load_recipe(
        write_recipe(
            tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=FINETUNE.format(epochs=1)
        )
    )
    first = run_recipe(recipe, tmp_path / "runs")
    created = read_json(first.stages[0].dir / "manifest.json")["created"]
    second = run_recipe(recipe, tmp_path / "runs")
    assert second.stages[0].reused and read_json(second.stages[0].dir / "manifest.json")["created"] == created
    third = run_recipe(recipe, tmp_path / "runs", fresh=True)
    assert not third.stages[0].reused


def test_changed_option_reruns_the_stage(tmp_path, tiny_bert_dir, reviews):
    path = write_recipe(
        tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=FINETUNE.format(epochs=1)
    )
    run_recipe(load_recipe(path), tmp_path / "runs")
    again = run_recipe(load_recipe(path, ("stages.0.lr=0.001",)), tmp_path / "runs")
    assert not again.stages[0].reused


def test_teacher_already_fine_tuned_is_not_retrained(tmp_path, tiny_bert_dir, reviews):
    stages = "  - type: finetune\n    epochs: 1\n"
    recipe = load_recipe(
        write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=stages)
    )
    result = run_recipe(recipe, tmp_path / "runs")
    manifest = read_json(result.stages[0].dir / "manifest.json")
    assert "already a classifier" in manifest["info"]["skipped"]
    assert sha256_file(result.stages[0].dir / "model.safetensors") == sha256_file(
        tiny_bert_dir / "model.safetensors"
    )


def test_killed_run_resumes_from_the_last_finished_stage(tmp_path, tiny_bert_dir, reviews):
    stages = FINETUNE.format(epochs=1) + FINETUNE.format(epochs=400)
    path = write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=stages)
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "compress.cli", "run", str(path), "--out", str(runs)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    deadline = time.time() + 240
    while not list((runs / "tiny").glob(".02-finetune.tmp-*")) and time.time() < deadline:
        assert proc.poll() is None, "run ended before it could be killed"
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = runs / "tiny" / "01-finetune"
    assert read_json(first / "manifest.json")["complete"] is True
    assert not (runs / "tiny" / "02-finetune").exists()
    created = read_json(first / "manifest.json")["created"]

    resumed = compress_cli("run", str(path), "--out", str(runs), "--set", "stages.1.epochs=1")
    assert resumed.returncode == 0, resumed.stderr
    assert "01-finetune" in resumed.stdout and "reused" in resumed.stdout.splitlines()[1]
    assert read_json(first / "manifest.json")["created"] == created
    assert read_json(runs / "tiny" / "02-finetune" / "manifest.json")["complete"] is True
    assert not list((runs / "tiny").glob(".*tmp*"))


def test_validate_broken_recipe_exits_2_with_one_line(tmp_path, reviews, tiny_bert_dir):
    path = write_recipe(
        tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages="  - type: finetune\n    epochs: 0\n"
    )
    out = compress_cli("validate", str(path))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"error: {path}:11 stages[0].epochs: must be > 0, got 0"]
    assert "Traceback" not in out.stderr


def test_run_folder_locked_by_another_process(tmp_path, tiny_bert_dir, reviews):
    """This process holds the run folder's lock as ``compress run`` does; the CLI in a second process
    must stop at once and name this process."""
    path = write_recipe(
        tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=FINETUNE.format(epochs=1)
    )
    with run_lock(tmp_path / "runs" / "tiny"):
        out = compress_cli("run", str(path), "--out", str(tmp_path / "runs"))
    assert out.returncode == 2
    assert f"another compress process (pid {os.getpid()}) is running this recipe" in out.stderr
