"""One rank of the 2-process distill test (run by torchrun): runs the recipe's distill stage alone
through ``compress.api.run_stage`` with a per-rank out_dir and records a hash of the student's final
weights."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import compress.distill.trainer as trainer
from compress.api import run_stage
from compress.recipe import load_recipe


def main(recipe_path: str, work: str) -> None:
    recipe, work_dir, rank = load_recipe(recipe_path), Path(work), int(os.environ["RANK"])
    students = []
    real = trainer.distill_model

    def spy(student, *args, **kwargs):
        students.append(student)
        return real(student, *args, **kwargs)

    trainer.distill_model = spy  # the stage imports it from the trainer when it runs
    out = work_dir / f"out-{rank}"
    out.mkdir(parents=True)
    result = run_stage(recipe, out)  # rank 0 writes out-0 (with its manifest); rank 1 writes nothing
    digest = hashlib.sha256()
    for key, tensor in sorted(students[0].state_dict().items()):
        digest.update(key.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    (work_dir / f"rank-{rank}.txt").write_text(f"{digest.hexdigest()} {result.metrics['processes']}\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
