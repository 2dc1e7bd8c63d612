"""SIGKILL in the middle of an export: the rerun reuses the finished stage and writes the same artifact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from compress.io import read_json
from tests.helpers.tiny import write_recipe

STAGES = "  - type: finetune\n    when: always\n    epochs: 1\n    batch_size: 16\n  - type: export\n"


def run_cli(path, runs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "compress.cli", "run", str(path), "--out", str(runs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def test_kill_mid_export_then_resume_gives_the_same_artifact(tmp_path, tiny_bert_dir, reviews):
    path = write_recipe(
        tmp_path / "r.yaml",
        teacher=tiny_bert_dir,
        data=reviews,
        stages=STAGES,
        extra="targets: [arm64-onnx]\n",
    )
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    proc = run_cli(path, killed)
    deadline = time.time() + 300
    while not list((killed / "tiny").glob(".02-export.tmp-*")) and time.time() < deadline:
        assert proc.poll() is None, "run ended before the export could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run_dir = killed / "tiny"
    assert not (run_dir / "02-export").exists()
    created = read_json(run_dir / "01-finetune" / "manifest.json")["created"]

    resumed = run_cli(path, killed)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0
    assert "reused" in next(line for line in out.splitlines() if "01-finetune" in line)
    assert read_json(run_dir / "01-finetune" / "manifest.json")["created"] == created
    assert not list(run_dir.glob(".*tmp*"))

    reference = run_cli(path, clean)
    reference.communicate(timeout=600)
    assert reference.returncode == 0
    # Weights, model files, tokenizers and labels are byte-identical to an uninterrupted run; only an
    # artifact's own manifest differs (it records its run folder's paths).
    for stage in ("01-finetune", "02-export"):
        ours, theirs = (
            {
                e["path"]: e["sha256"]
                for e in read_json(root / stage / "manifest.json")["files"]
                if not e["path"].endswith("/manifest.json")
            }
            for root in (run_dir, clean / "tiny")
        )
        assert ours == theirs, stage
    assert any(name.endswith("model.onnx") for name in ours)
