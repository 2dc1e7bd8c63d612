"""Data-parallel distillation with 2 CPU processes (torchrun, gloo): same weights, one writer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.tiny import write_recipe

DISTILL = """  - type: distill
    layers: 1
    epochs: 2
    batch_size: 8
    lr: 1.0e-3
    weights: {soft: 1.0, hard: 1.0, hidden: 1.0}
"""


def test_two_processes_end_with_identical_weights_and_write_once(tmp_path, tiny_bert_dir, reviews):
    recipe = write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=DISTILL)
    work = tmp_path / "work"
    worker = Path(__file__).with_name("distill_ddp_worker.py")
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--standalone",
            str(worker),
            str(recipe),
            str(work),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [(work / f"rank-{r}.txt").read_text().split() for r in (0, 1)]
    assert ranks[0] == ranks[1]
    assert ranks[0][1] == "2"
    assert (work / "out-0" / "model.safetensors").is_file()
    assert list((work / "out-1").iterdir()) == []
    assert len(list((work / ".cache" / "distill").glob("teacher-*.safetensors"))) == 2
