"""Base classes of every pydantic model: ``Strict`` for configs a person writes (unknown keys rejected,
values checked at the door), ``Open`` for files compress wrote (unknown keys kept)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

_NUMBERS = (int, float)


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
