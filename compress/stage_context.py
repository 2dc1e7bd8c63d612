"""What a stage handler is given and what it returns: its config, the run it works in, its result.

A handler reads its inputs from the ``StageContext`` and writes everything it produces into
``ctx.out_dir`` (a temporary folder the pipeline renames into place when the handler returns).
It returns a ``StageResult``; the pipeline writes the manifest. Handlers never print to stdout.
The stage registry (``compress.stages``) and the algorithms a handler calls (``compress.distill``)
both take a context, so it sits below them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from compress.config import Strict

if TYPE_CHECKING:
    from compress.data import Split
    from compress.recipe_base import RecipeBase
    from compress.targets import TargetProfile


class StageConfig(Strict):
    """Every stage config has ``type``; subclasses narrow it to ``Literal["<name>"]``."""

    type: str


@dataclass(frozen=True)
class FinishedStage:
    """A stage folder of this run that has finished: its type, folder and manifest."""

    type: str
    dir: Path
    manifest: dict[str, Any]


@dataclass
class StageContext:
    recipe: RecipeBase
    config: StageConfig
    index: int
    out_dir: Path
    run_dir: Path
    teacher_dir: Path
    """The fine-tuned teacher: the recipe's teacher, or the output of a ``finetune`` stage."""
    input_dir: Path
    """The newest model checkpoint in the run (the teacher when no stage produced a model yet)."""
    previous: list[FinishedStage]
    cache_dir: Path
    """``<run>/.cache``: shared across stages and reruns, e.g. teacher outputs keyed by hash."""
    seed: int = 0
    _splits: dict[str, Split] = field(default_factory=dict)

    def split(self, name: Literal["train", "eval", "test"]) -> Split:
        """The recipe's data split, loaded once per run."""
        if name not in self._splits:
            from compress.data import load_recipe_split

            self._splits[name] = load_recipe_split(self.recipe, name)
        return self._splits[name]

    def where(self) -> str:
        """``recipes/x.yaml stages[2]``: the prefix of an error about this stage's options."""
        source = getattr(self.recipe, "_source", None) or "recipe"
        return f"{source} stages[{self.index - 1}]"

    def targets(self) -> list[TargetProfile]:
        return [self.recipe.target_profile(name) for name in self.recipe.targets]

    def last(self, stage_type: str) -> FinishedStage | None:
        for stage in reversed(self.previous):
            if stage.type == stage_type:
                return stage
        return None


@dataclass
class StageResult:
    metrics: dict[str, Any] = field(default_factory=dict)
    """Numbers a person reads: accuracy, agreement, parameter count, loss curves, ..."""
    info: dict[str, Any] = field(default_factory=dict)
    """Anything else worth recording in the manifest (e.g. which layers stayed float)."""
