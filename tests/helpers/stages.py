"""A stage's context for running one stage handler alone, without the pipeline's final report."""

from __future__ import annotations

from pathlib import Path

from compress.api import stage_context as api_stage_context
from compress.recipe import load_recipe
from compress.stages.base import StageContext


def stage_context(recipe_path: Path, work: Path, teacher: Path) -> StageContext:
    """The context of a one-stage recipe's only stage, writing into ``work/out`` (cache: ``work/.cache``)."""
    out = work / "out"
    out.mkdir(parents=True, exist_ok=True)
    return api_stage_context(load_recipe(recipe_path), out, teacher=teacher)
