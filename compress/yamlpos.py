"""Load YAML safely, remembering each key's line, for errors like ``x.yaml:12 stages[1].epochs``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from compress.errors import RecipeError

Loc = tuple[str | int, ...]


def _walk(node: yaml.Node, loc: Loc, lines: dict[Loc, int], seen: set[int]) -> None:
    """Record each key's line; an aliased node is walked once, so an alias bomb stays linear."""
    lines[loc] = node.start_mark.line + 1
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in first and key != "<<":
                raise _DuplicateKey(f"{line}: duplicate key '{key}' (first at line {first[key]}); keep one")
            first[key] = line
            lines[(*loc, key)] = line
            _walk(value_node, (*loc, key), lines, seen)
            lines[(*loc, key)] = line
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, (*loc, index), lines, seen)


class _DuplicateKey(Exception):
    """YAML keeps the last of two equal keys silently; a recipe with both is almost always a mistake."""


def load_yaml_with_lines(path: Path) -> tuple[Any, dict[Loc, int]]:
    """Parse ``path`` with the safe loader; return the data and a map from key path to line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"{path}: file not found; check the path") from None
    except IsADirectoryError:
        raise RecipeError(f"{path}: is a folder, expected a YAML file") from None
    except PermissionError:
        raise RecipeError(f"{path}: not readable; check its permissions") from None
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    lines: dict[Loc, int] = {}
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None:
            _walk(node, (), lines, set())
        data = yaml.safe_load(text)
    except _DuplicateKey as exc:
        raise RecipeError(f"{path}:{exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        problem = " ".join((exc.problem or exc.context or "invalid YAML").split())
        if isinstance(exc, yaml.constructor.ConstructorError) and "tag" in problem:
            fix = "tags such as !!python/... are not allowed (safe loading); remove it"
            raise RecipeError(f"{path}{line}: {problem}; {fix}") from None
        raise RecipeError(f"{path}{line}: malformed YAML: {problem}; fix the syntax at that line") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: malformed YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise RecipeError(f"{path}: YAML nested too deeply; flatten it") from None
    return data, lines


def line_for(lines: dict[Loc, int], loc: Loc) -> int | None:
    """The line of the deepest known prefix of ``loc``."""
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def format_loc(loc: Loc) -> str:
    """``stages[1].temperature``; a key that is not a plain name (a newline, a dot, a space) is quoted
    the way Python writes it, so the error stays one readable line."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = str(part)
            name = name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else repr(name)
            out += f".{name}" if out else name
    return out or "(top level)"
