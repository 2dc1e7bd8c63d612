"""Recipes: YAML validated with pydantic; errors name the file, the line, the key and the fix."""

from __future__ import annotations

import errno
import os
import re
import reprlib
import stat
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from compress.config import Strict
from compress.errors import CompressError, RecipeError
from compress.yamlpos import Loc, format_loc, line_for, load_yaml_with_lines

if TYPE_CHECKING:
    from compress.targets import TargetProfile

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
MAX_RECIPE_BYTES = 1 << 20
"""A recipe is a few kB; anything larger is the wrong file (and /dev/zero would never end)."""
SEED_MAX = 2**32 - 1 - 1024
"""numpy takes seeds 0..2**32-1 and the run derives a few more (seed + 1, seed + process index)."""
OFFSET_POSITIONS = {"roberta": 2, "xlm-roberta": 2, "camembert": 2, "data2vec-text": 2, "longformer": 2}
"""Models whose first position ids are reserved (padding_idx + 1): usable length = table - offset."""
_SHORT = reprlib.Repr()
"""Shows a bad value in an error without printing (or expanding) a huge or aliased structure."""
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 4, 4, 60, 60


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


@lru_cache(maxsize=1)
def recipe_model() -> type[BaseModel]:
    """The Recipe model with ``stages`` as a union of every registered stage config, by ``type``."""
    from compress.stages import STAGES

    configs = tuple(spec.config_cls for spec in STAGES.values())
    stage_union = Annotated[Union[configs], Field(discriminator="type")]  # noqa: UP007
    return create_model("Recipe", __base__=RecipeBase, stages=(list[stage_union], Field(min_length=1)))


Recipe = RecipeBase  # type alias for annotations: every loaded recipe is a recipe_model() instance


def _describe_error(err: dict[str, Any]) -> str:
    kind = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown key; remove it or check its spelling (run `compress schema` for the allowed keys)"
    if kind == "missing":
        return "required key is missing; add it"
    if kind == "union_tag_invalid":
        from compress.stages import STAGES

        return f"unknown stage type {ctx.get('tag')!r}; known types: {', '.join(sorted(STAGES))}"
    if kind == "union_tag_not_found":
        return "each stage needs a 'type' key, e.g. type: distill"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[
            kind
        ]
        bound = next(iter(ctx.values()))
        return f"must be {op} {bound}, got {value!r}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {value!r}"
    if kind == "string_pattern_mismatch" and ctx.get("pattern") == NAME_PATTERN:
        return (
            "must be letters, digits, '.', '_' or '-', starting with a letter or digit "
            f"(it names the run folder), got {value!r}"
        )
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}, got {value!r}"
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}; add one"
    msg = re.sub(r"^Value error, ", "", err["msg"])
    if kind == "value_error":
        return msg
    msg = f"{msg[0].lower()}{msg[1:]}" if msg[:1].isupper() and msg[1:2].islower() else msg
    shown = _SHORT.repr(value)
    return f"{msg} ({shown})" if " got " in msg else f"{msg}, got {shown}"


def _clean_loc(loc: tuple[Any, ...], data: Any) -> Loc:
    """Drop pydantic's discriminator tags (``stages.1.distill.epochs`` -> ``stages[1].epochs``)."""
    from compress.stages import STAGES

    out: list[str | int] = []
    for part in loc:
        if (
            isinstance(part, str)
            and part in STAGES
            and out
            and isinstance(out[-1], int)
            and out[-2:-1] == ["stages"]
        ):
            continue
        if isinstance(part, str) and (part.startswith("function-") or part.startswith("list[")):
            continue
        out.append(part)
    return tuple(out)


def validation_error_line(
    path: Path | str, lines: dict[Loc, int], exc: ValidationError, data: Any = None
) -> str:
    """The first validation error as one line: ``file:line key: problem; fix``."""
    err = exc.errors()[0]
    loc = _clean_loc(err["loc"], data)
    problem = _describe_error(err)
    key = re.match(r"^([A-Za-z_][A-Za-z0-9_]*): (.*)$", problem) if err["type"] == "value_error" else None
    if key:  # a model-level check that names its field: point at that field's line
        loc, problem = (*loc, key.group(1)), key.group(2)
    line = line_for(lines, loc)
    where = f"{path}:{line}" if line else str(path)
    extra = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{where} {format_loc(loc)}: {problem}{extra}"


def parse_override(text: str) -> tuple[list[str | int], Any]:
    """``stages.1.epochs=3`` -> (['stages', 1, 'epochs'], 3); the value is parsed as YAML."""
    if "=" not in text:
        raise RecipeError(f"--set {text!r}: expected path.to.key=value, e.g. --set stages.1.epochs=3")
    key, raw = text.split("=", 1)
    parts: list[str | int] = []
    for piece in re.split(r"\.|\[(\d+)\]", key.strip()):
        if piece:
            parts.append(int(piece) if piece.isdigit() else piece)
    if not parts:
        raise RecipeError(f"--set {text!r}: the key is empty; expected path.to.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_override(data: Any, parts: list[str | int], value: Any, text: str) -> None:
    node = data
    for depth, part in enumerate(parts[:-1]):
        nxt = parts[depth + 1]
        if isinstance(node, dict):
            if part not in node or node[part] is None:
                node[part] = [] if isinstance(nxt, int) else {}
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            raise RecipeError(
                f"--set {text!r}: {format_loc(tuple(parts[: depth + 1]))} does not exist in the recipe"
            )
    last = parts[-1]
    if isinstance(node, dict) or (isinstance(node, list) and isinstance(last, int) and last < len(node)):
        node[last] = value
    else:
        raise RecipeError(f"--set {text!r}: {format_loc(tuple(parts))} does not exist in the recipe")


def _check_recipe_file(path: Path) -> None:
    """The recipe must be a regular file of at most MAX_RECIPE_BYTES: reading a FIFO or a device
    could block or never end, and a loop or a permission problem is not 'file not found'."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise RecipeError(f"{path}: file not found; check the path") from None
    except OSError as exc:
        cause = "symbolic link loop" if exc.errno == errno.ELOOP else exc.strerror
        raise RecipeError(f"{path}: cannot read ({cause}); point it at a YAML file") from None
    if stat.S_ISDIR(info.st_mode):
        raise RecipeError(f"{path}: is a folder, expected a YAML file")
    if not stat.S_ISREG(info.st_mode):
        raise RecipeError(
            f"{path}: not a regular file (a FIFO, pipe or device); save the recipe to a .yaml file, pass that"
        )
    if info.st_size > MAX_RECIPE_BYTES:
        raise RecipeError(
            f"{path}: {info.st_size} bytes, more than a recipe's {MAX_RECIPE_BYTES}; is this the recipe file?"
        )


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """Load, override and validate a recipe. Relative paths in it resolve against its folder."""
    path = Path(path)
    _check_recipe_file(path)
    data, lines = load_yaml_with_lines(path)
    if data is None:
        raise RecipeError(f"{path}: the recipe is empty; start from recipes/distil8.yaml")
    if not isinstance(data, dict):
        raise RecipeError(f"{path}:1: a recipe must be a mapping of keys, got {type(data).__name__}")
    for text in overrides:
        parts, value = parse_override(text)
        apply_override(data, parts, value, text)
    try:
        recipe = recipe_model().model_validate(data)
    except ValidationError as exc:
        raise RecipeError(validation_error_line(path, lines, exc, data)) from None
    recipe._source = path.resolve()
    _check_files(recipe, path, lines)
    return recipe


def recipe_dir(recipe: Any) -> Path:
    source = getattr(recipe, "_source", None)
    return source.parent if source else Path.cwd()


def resolve_path(recipe: Any, value: str) -> Path:
    """A path from the recipe, relative to the recipe's folder unless absolute."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else (recipe_dir(recipe) / p)


def _check_files(recipe: Any, path: Path, lines: dict[Loc, int]) -> None:
    def fail(loc: Loc, msg: str) -> None:
        line = line_for(lines, loc)
        raise RecipeError(
            f"{path}:{line} {format_loc(loc)}: {msg}" if line else f"{path} {format_loc(loc)}: {msg}"
        )

    for split in ("train", "eval", "test"):
        source = getattr(recipe.data, split)
        if source is not None and source.path:
            problem = _data_file_problem(resolve_path(recipe, source.path))
            if problem:
                fail(("data", split, "path"), problem)
    if recipe.teacher.path:
        folder = resolve_path(recipe, recipe.teacher.path)
        if not folder.is_dir():
            fail(("teacher", "path"), f"folder not found: {folder}; point it at a Hugging Face model folder")
        _check_positions(recipe, folder / "config.json", fail)


def _data_file_problem(file: Path) -> str | None:
    """Why a data path cannot be read, in words that name the real cause; None when it can."""
    try:
        mode = os.stat(file).st_mode
    except FileNotFoundError:
        return f"file not found: {file}; fix the path (relative paths start at the recipe's folder)"
    except OSError as exc:
        cause = "a symbolic link loop" if exc.errno == errno.ELOOP else exc.strerror
        return f"{file}: cannot be read ({cause}); point it at a TSV, CSV or JSONL file"
    if stat.S_ISDIR(mode):
        return f"{file} is a folder; point it at a TSV, CSV or JSONL file"
    if not stat.S_ISREG(mode):
        return f"{file} is not a regular file (a FIFO or device); save the data to a file first"
    return None


def position_limit(config_file: Path) -> int | None:
    """The longest input a local teacher's position table takes, from config.json alone (no weights).

    None when the config does not say (no ``max_position_embeddings``, e.g. relative positions);
    a config.json compress cannot read is reported here, before any training.
    """
    from compress.io import read_json

    if not config_file.is_file():
        return None
    try:
        config = read_json(config_file, redo="re-save the model (save_pretrained)")
    except CompressError as exc:
        raise RecipeError(str(exc)) from None
    if not isinstance(config, dict):
        raise RecipeError(f"{config_file}: must be a JSON object; re-save the model (save_pretrained)")
    table = config.get("max_position_embeddings")
    if not isinstance(table, int) or isinstance(table, bool) or table <= 0:
        return None
    return table - OFFSET_POSITIONS.get(str(config.get("model_type")), 0)


def _check_positions(recipe: Any, config_file: Path, fail: Any) -> None:
    """task.max_length (and each target's longest input) must fit the teacher's position table."""
    limit = position_limit(config_file)
    if limit is None:
        return
    if recipe.task.max_length > limit:
        fail(
            ("task", "max_length"),
            f"{recipe.task.max_length} is longer than the teacher's position table ({limit} tokens, "
            f"{config_file}); use at most {limit}",
        )
    for name in recipe.targets:
        longest = recipe.target_profile(name).max_length
        if longest > limit:
            fail(
                ("targets",),
                f"target {name} feeds {longest} tokens but the teacher takes at most {limit}; narrow it "
                f"with target_options: {{{name}: {{sequence_lengths: [...]}}}} (each <= {limit})",
            )


def json_schema() -> dict[str, Any]:
    return recipe_model().model_json_schema()
