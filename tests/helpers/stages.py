"""A stage's context for running one stage handler alone, without the pipeline's final report."""

from __future__ import annotations

from pathlib import Path

from compress.recipe import load_recipe
from compress.stages.base import StageContext


def stage_context(recipe_path: Path, work: Path, teacher: Path) -> StageContext:
    """The context of a one-stage recipe's only stage, writing into ``work/out``."""
    recipe = load_recipe(recipe_path)
    out = work / "out"
    out.mkdir(parents=True, exist_ok=True)
    return StageContext(
        recipe=recipe,
        config=recipe.stages[0],
        index=1,
        out_dir=out,
        run_dir=work,
        teacher_dir=teacher,
        input_dir=teacher,
        previous=[],
        cache_dir=work / ".cache",
        seed=recipe.seed,
    )
