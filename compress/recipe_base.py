"""Everything in a recipe but its stages: the task, teacher, data, targets, gates and evaluation sections,
and how a recipe's relative paths resolve.

``compress.recipe`` adds the ``stages`` list (a union of every stage's config) and loads files; the
stages themselves, the data loaders and the gates read only these sections, so they sit below it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from compress.config import Strict

if TYPE_CHECKING:
    from compress.targets import TargetProfile

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
SEED_MAX = 2**32 - 1 - 1024
"""numpy takes seeds 0..2**32-1 and the run derives a few more (seed + 1, seed + process index)."""


class TaskConfig(Strict):
    type: Literal["classification"] = "classification"
    text: str = "text"
    text_pair: str | None = None
    label: str = "label"
    max_length: int = Field(128, gt=0, le=8192)
    labels: list[str] | None = Field(None, min_length=2)
    """Label names in id order. Data labels may be these names or their integer ids."""

    @field_validator("labels")
    @classmethod
    def _distinct_labels(cls, value: list[str] | None) -> list[str] | None:
        """Two equal names would make one of the ids unreachable from the data."""
        if value is not None:
            twice = sorted({name for name in value if value.count(name) > 1})
            if twice:
                raise ValueError(f"label {twice[0]!r} is listed twice; give each class one distinct name")
        return value


class TeacherConfig(Strict):
    """Exactly one of ``path`` (local folder), ``hub`` (model id) or ``package`` (``pkg/sub/dir``)."""

    path: str | None = None
    hub: str | None = None
    revision: str | None = None
    package: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(/[^/]+)*$")
    trust_remote_code: bool = False
    allow_pickle: bool = False

    @model_validator(mode="after")
    def _one_source(self) -> TeacherConfig:
        given = [k for k in ("path", "hub", "package") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of path, hub or package (got {', '.join(given) or 'none'})")
        return self

    def load_options(self) -> dict[str, bool]:
        """Keyword arguments for loading this teacher, or any checkpoint made from it."""
        return {"trust_remote_code": self.trust_remote_code, "allow_pickle": self.allow_pickle}


class Columns(Strict):
    text: str | None = None
    text_pair: str | None = None
    label: str | None = None


class DataSource(Strict):
    """A local TSV/CSV/JSONL file, or a Hugging Face ``datasets`` id with a split."""

    path: str | None = None
    format: Literal["tsv", "csv", "jsonl"] | None = None
    hub: str | None = None
    subset: str | None = None
    split: str | None = None
    columns: Columns = Field(default_factory=Columns)
    limit: int | None = Field(None, gt=0)
    """Use only the first N rows (after loading), e.g. to keep CI short."""

    @model_validator(mode="after")
    def _one_source(self) -> DataSource:
        if bool(self.path) == bool(self.hub):
            raise ValueError("give exactly one of path (local file) or hub (datasets id)")
        if self.hub and not self.split:
            raise ValueError("a hub dataset needs split, e.g. split: train")
        if self.path and not self.format and Path(self.path).suffix.lower() not in (".tsv", ".csv", ".jsonl"):
            raise ValueError(f"cannot tell the format of '{self.path}'; add format: tsv|csv|jsonl")
        return self


class DataConfig(Strict):
    train: DataSource
    eval: DataSource
    test: DataSource | None = None
    """Held-out split for the final report; without it the report uses ``eval``."""


class BaselineGates(Strict):
    report: str | None = None
    max_accuracy_drop: float = Field(0.01, ge=0, le=1)
    max_latency_rise: float = Field(0.25, ge=0)
    """Relative rise of p50 latency allowed over the baseline (0.25 = 25%)."""
    latency_noise_ms: float = Field(1.0, ge=0)
    max_bytes_rise: float = Field(0.02, ge=0)


class GatesConfig(Strict):
    apply_to: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    """Artifact names (glob patterns) the absolute gates apply to."""
    min_accuracy: float | None = Field(None, ge=0, le=1)
    min_agreement: float | None = Field(None, ge=0, le=1)
    max_accuracy_drop: float | None = Field(None, ge=0, le=1)
    max_latency_p50_ms: float | None = Field(None, gt=0)
    max_latency_p90_ms: float | None = Field(None, gt=0)
    max_bytes: int | None = Field(None, gt=0)
    min_speedup: float | None = Field(None, gt=0)
    baseline: BaselineGates | None = None


class EvaluateConfig(Strict):
    enabled: bool = True
    """Evaluate and report at the end of ``compress run``; off only for quick experiments (no gates)."""
    split: Literal["eval", "test"] | None = None
    """Which split the final check uses; default ``test`` when the recipe has one, else ``eval``."""
    latency_samples: int = Field(200, gt=0)
    warmup: int = Field(10, ge=0)
    throughput_batch: int = Field(32, gt=0)
    threads: int | None = Field(None, gt=0)
    """Threads for latency; default: the artifact's target profile, 2 for the teacher."""


class TargetOptions(Strict):
    sequence_lengths: list[int] | None = Field(None, min_length=1)
    """Narrow the profile's lengths (TFLite signatures; the longest input an ONNX artifact takes) to
    these, each at most the profile's longest: e.g. [32, 64] for a student whose share stage keeps
    64 positions. Shorter signatures are also smaller and faster to convert."""


class RecipeBase(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    seed: int = Field(0, ge=0, le=SEED_MAX)
    task: TaskConfig = Field(default_factory=TaskConfig)
    teacher: TeacherConfig
    data: DataConfig
    targets: list[str] = Field(default_factory=list)
    target_options: dict[str, TargetOptions] = Field(default_factory=dict)
    """Per-target changes to the stock profile, by target name (see ``target_profile``)."""
    gates: GatesConfig | None = None
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    _source: Path | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _gates_need_a_report(self) -> RecipeBase:
        if self.gates is not None and not self.evaluate.enabled:
            raise ValueError("gates need the final evaluation; remove evaluate.enabled: false or the gates")
        return self

    def target_profile(self, name: str) -> TargetProfile:
        """The profile of one of this recipe's targets, with the recipe's ``target_options`` applied."""
        from compress.targets import load_target

        profile = load_target(name)
        options = self.target_options.get(name)
        if options is None or options.sequence_lengths is None:
            return profile
        return profile.model_copy(update={"sequence_lengths": sorted(set(options.sequence_lengths))})

    @model_validator(mode="after")
    def _target_options_narrow_listed_targets(self) -> RecipeBase:
        from compress.targets import load_target

        for name, options in self.target_options.items():
            if name not in self.targets:
                raise ValueError(
                    f"target_options: '{name}' is not in targets ({', '.join(self.targets) or 'none'}); "
                    "add it to targets or remove its options"
                )
            longest = load_target(name).max_length
            for length in options.sequence_lengths or []:
                if not 0 < length <= longest:
                    raise ValueError(
                        f"target_options.{name}.sequence_lengths: {length} is outside 1..{longest} "
                        f"(the profile's longest); narrow the profile's lengths, never extend them"
                    )
        return self

    @model_validator(mode="after")
    def _trimmed_positions_cover_inputs(self) -> RecipeBase:
        """A share stage's ``positions`` must reach every input length the rest of the run feeds in."""
        if not any(getattr(stage, "positions", None) for stage in getattr(self, "stages", [])):
            return self  # nothing trimmed: no target files to read at load time
        needs = {"task.max_length": self.task.max_length}
        needs |= {f"target {name}": self.target_profile(name).max_length for name in self.targets}
        for index, stage in enumerate(getattr(self, "stages", [])):
            kept = getattr(stage, "positions", None)
            recovery = getattr(stage, "recovery", None)
            own = {f"stages[{index}].recovery.max_length": getattr(recovery, "max_length", None) or 0}
            for what, length in (needs | own).items() if kept else ():
                if length > kept:
                    raise ValueError(
                        f"stages[{index}].positions: {kept} is shorter than {what} ({length} tokens); "
                        f"keep at least {length} positions"
                        + (
                            f" or narrow it with target_options: {{{what[7:]}: {{sequence_lengths: [...]}}}}"
                            if what.startswith("target ")
                            else ""
                        )
                    )
        return self

    @model_validator(mode="after")
    def _stage_options_fit_the_task_and_targets(self) -> RecipeBase:
        """Options that only work for a pair task or an ONNX target, checked before anything runs."""
        for index, stage in enumerate(getattr(self, "stages", [])):
            recovery = getattr(stage, "recovery", None)
            for where, options in (
                (f"stages[{index}].augment", getattr(stage, "augment", None)),
                (f"stages[{index}].recovery.augment", getattr(recovery, "augment", None)),
            ):
                if getattr(options, "swap_pairs", False) and self.task.text_pair is None:
                    raise ValueError(
                        f"{where}.swap_pairs: the task has no second text to swap (task.text_pair is "
                        "unset); remove swap_pairs"
                    )
            if getattr(stage, "embedding_bits", 8) == 4:
                names = getattr(stage, "targets", None) or self.targets
                if not any(self.target_profile(name).format == "onnx" for name in names):
                    raise ValueError(
                        f"stages[{index}].embedding_bits: 4 applies to ONNX targets, and this stage has "
                        f"none ({', '.join(names) or 'no targets'}); use embedding_bits: 8"
                    )
        return self

    @field_validator("targets")
    @classmethod
    def _known_targets(cls, value: list[str]) -> list[str]:
        from compress.targets import available_targets, targets_dir

        known = available_targets()
        for name in value:
            if name not in known:
                raise ValueError(
                    f"unknown target '{name}'; known targets in {targets_dir()}: {', '.join(known)}"
                )
        if len(set(value)) != len(value):
            raise ValueError("a target is listed twice")
        return value


def recipe_dir(recipe: Any) -> Path:
    source = getattr(recipe, "_source", None)
    return source.parent if source else Path.cwd()


def resolve_path(recipe: Any, value: str) -> Path:
    """A path from the recipe, relative to the recipe's folder unless absolute."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else (recipe_dir(recipe) / p)
