"""Base classes of every pydantic model: ``Strict`` for configs a person writes (unknown keys rejected,
values checked at the door), ``Open`` for files compress wrote (unknown keys kept)."""

from __future__ import annotations

import re
import reprlib
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from compress.yamlpos import Loc, format_loc, line_for

_NUMBERS = (int, float)
MAX_CONFIG_BYTES = 1 << 20
"""A recipe or a target profile is a few kB; anything larger is the wrong file (/dev/zero never ends)."""
_SHORT = reprlib.Repr()
"""Shows a bad value in an error without printing (or expanding) a huge or aliased structure."""
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 4, 4, 60, 60


def _numeric_only(annotation: Any) -> str | None:
    """'integer'/'number' when a field holds only numbers (optionally None), else None."""
    if annotation in _NUMBERS:
        return "integer" if annotation is int else "number"
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if args and all(a in _NUMBERS for a in args):
            return "integer" if all(a is int for a in args) else "number"
    return None


class Strict(BaseModel):
    """``allow_inf_nan=False``: a YAML ``.inf`` or ``.nan`` passes every ``gt``/``le`` bound check
    (nan compares false) and only fails hours later inside training, so it is rejected here."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, data: Any) -> Any:
        """YAML reads yes/no/on/off as booleans; ``epochs: yes`` must not quietly become 1."""
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name) if isinstance(name, str) else None
                if field is None or not isinstance(value, bool):
                    continue
                kind = _numeric_only(field.annotation)
                if kind:
                    raise ValueError(f"{name}: input should be a valid {kind}, got {value}")
        return data


class Open(BaseModel):
    """A file compress wrote: the keys it needs are checked, keys from a newer minor version are kept."""

    model_config = ConfigDict(extra="allow")


def describe_error(err: dict[str, Any]) -> str:
    """One pydantic error in words that say what is wrong and, where it can, what would be right."""
    kind = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown key; remove it or check its spelling (run `compress schema` for the allowed keys)"
    if kind == "missing":
        return "required key is missing; add it"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[
            kind
        ]
        bound = next(iter(ctx.values()))
        return f"must be {op} {bound}, got {value!r}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {value!r}"
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


def _child(node: Any, part: str | int) -> Any:
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
        return node[part]
    return None


def _clean_loc(loc: tuple[Any, ...], data: Any) -> Loc:
    """The error's place as the user wrote it: pydantic's validator names are dropped, and so is a
    discriminated union's tag (``stages.1.distill.epochs`` -> ``stages[1].epochs``), found as the part
    that is one of the item's values (its ``type``) rather than one of its keys."""
    out: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(part, str) and (part.startswith("function-") or part.startswith("list[")):
            continue
        if isinstance(node, dict) and isinstance(part, str) and part not in node and part in node.values():
            continue
        out.append(part)
        node = _child(node, part)
    return tuple(out)


def validation_error_line(
    path: Path | str,
    lines: dict[Loc, int],
    exc: ValidationError,
    data: Any = None,
    describe: Callable[[dict[str, Any]], str] = describe_error,
) -> str:
    """The first validation error as one line: ``file:line key: problem; fix``. ``data`` is what was
    validated (to place the error); ``describe`` words the problem (a caller's own wording first)."""
    err = exc.errors()[0]
    loc = _clean_loc(err["loc"], data)
    problem = describe(err)
    key = re.match(r"^([A-Za-z_][A-Za-z0-9_]*): (.*)$", problem) if err["type"] == "value_error" else None
    if key:  # a model-level check that names its field: point at that field's line
        loc, problem = (*loc, key.group(1)), key.group(2)
    line = line_for(lines, loc)
    where = f"{path}:{line}" if line else str(path)
    extra = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{where} {format_loc(loc)}: {problem}{extra}"
