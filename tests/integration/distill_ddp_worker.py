"""One rank of the 2-process distill test (run by torchrun): runs the distill stage handler with a
per-rank out_dir and records a hash of the student's final weights."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import compress.distill.trainer as trainer
import compress.stages.distill as stage
from compress.models import resolve_teacher
from compress.recipe import load_recipe
from compress.recipe_base import recipe_dir
from compress.stages.base import StageContext


def main(recipe_path: str, work: str) -> None:
    recipe, work_dir, rank = load_recipe(recipe_path), Path(work), int(os.environ["RANK"])
    teacher = resolve_teacher(recipe.teacher, recipe_dir(recipe))
    students = []
    real = trainer.distill_model

    def spy(student, *args, **kwargs):
        students.append(student)
        return real(student, *args, **kwargs)

    trainer.distill_model = spy  # the stage imports it from the trainer when it runs
    out = work_dir / f"out-{rank}"
    out.mkdir(parents=True)
    ctx = StageContext(
        recipe=recipe,
        config=recipe.stages[0],
        index=1,
        out_dir=out,
        run_dir=work_dir,
        teacher_dir=teacher,
        input_dir=teacher,
        previous=[],
        cache_dir=work_dir / ".cache",
        seed=recipe.seed,
    )
    result = stage.run(ctx)
    digest = hashlib.sha256()
    for key, tensor in sorted(students[0].state_dict().items()):
        digest.update(key.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    (work_dir / f"rank-{rank}.txt").write_text(f"{digest.hexdigest()} {result.metrics['processes']}\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
