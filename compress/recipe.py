"""Recipes: YAML validated with pydantic; errors name the file, the line, the key and the fix.

A recipe is ``RecipeBase`` (``compress.recipe_base``) plus ``stages``, a list validated against the
config of each registered stage type, so this module sits above the stages it names.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, Field, ValidationError, create_model

from compress.config import MAX_CONFIG_BYTES, describe_error, validation_error_line
from compress.errors import CompressError, RecipeError
from compress.recipe_base import NAME_PATTERN, RecipeBase, resolve_path
from compress.stages import STAGES
from compress.yamlpos import Loc, format_loc, line_for, load_yaml_with_lines

OFFSET_POSITIONS = {"roberta": 2, "xlm-roberta": 2, "camembert": 2, "data2vec-text": 2, "longformer": 2}
"""Models whose first position ids are reserved (padding_idx + 1): usable length = table - offset."""


@lru_cache(maxsize=1)
def recipe_model() -> type[BaseModel]:
    """The Recipe model with ``stages`` as a union of every registered stage config, by ``type``."""
    configs = tuple(spec.config_cls for spec in STAGES.values())
    stage_union = Annotated[Union[configs], Field(discriminator="type")]  # noqa: UP007
    return create_model("Recipe", __base__=RecipeBase, stages=(list[stage_union], Field(min_length=1)))


def _describe_error(err: dict[str, Any]) -> str:
    """The recipe's own wording for a stage without a known type and for the run name; every other
    error as ``compress.config.describe_error`` says it."""
    ctx = err.get("ctx") or {}
    if err["type"] == "union_tag_invalid":
        return f"unknown stage type {ctx.get('tag')!r}; known types: {', '.join(sorted(STAGES))}"
    if err["type"] == "union_tag_not_found":
        return "each stage needs a 'type' key, e.g. type: distill"
    if err["type"] == "string_pattern_mismatch" and ctx.get("pattern") == NAME_PATTERN:
        return (
            "must be letters, digits, '.', '_' or '-', starting with a letter or digit "
            f"(it names the run folder), got {err.get('input')!r}"
        )
    return describe_error(err)


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
    """The recipe must be a regular file of at most MAX_CONFIG_BYTES: reading a FIFO or a device
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
    if info.st_size > MAX_CONFIG_BYTES:
        raise RecipeError(
            f"{path}: {info.st_size} bytes, more than a recipe's {MAX_CONFIG_BYTES}; is this the recipe file?"
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
        raise RecipeError(validation_error_line(path, lines, exc, data, _describe_error)) from None
    recipe._source = path.resolve()
    _check_files(recipe, path, lines)
    return recipe


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
    _check_stage_targets(recipe, fail)


def _check_stage_targets(recipe: Any, fail: Any) -> None:
    """What the export and quantize stages would refuse once they run (after distillation), refused now:
    a stage's targets must be the recipe's, and each target's profile must allow the stage's scheme."""
    from compress.stages.export import select_targets
    from compress.stages.quantize import checked_schemes

    profiles = [recipe.target_profile(name) for name in recipe.targets]
    packed: dict[str, int] = {}  # ONNX target -> the export stage that packs its attention
    for index, stage in enumerate(recipe.stages):
        if stage.type not in ("export", "quantize"):
            continue
        try:
            chosen = select_targets(profiles, stage.targets, stage.type, f"{stage.type}.targets")
            if stage.type == "quantize":
                schemes = checked_schemes(stage, chosen)
                _check_packed_attention(stage, schemes, packed)
        except RecipeError as exc:
            fail(("stages", index), str(exc))
        if stage.type == "export":
            for profile in chosen:
                packed.pop(profile.name, None)
                if profile.format == "onnx" and stage.fuse and stage.attention == "packed":
                    packed[profile.name] = index


def _check_packed_attention(stage: Any, schemes: dict[str, str], packed: dict[str, int]) -> None:
    """A packed query/key/value weight has no static int8 quantizer (it would stay float)."""
    for target, scheme in schemes.items():
        if target in packed and scheme in ("static", "auto"):
            raise RecipeError(
                f"quantize.scheme: {scheme} int8 of '{target}' cannot quantize the packed attention weight "
                f"of stages[{packed[target]}].attention: packed; set attention: separate there or use "
                "scheme: dynamic"
            )


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
