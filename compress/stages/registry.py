"""The stage registry: a decorator into a dict keyed by stage type.

Stage modules register themselves here when ``compress.stages`` imports them; they import this
module, never the package, so the package can import them without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from compress.stages.base import Handler, StageConfig, StageSpec

STAGES: dict[str, StageSpec] = {}


def register_stage(
    name: str,
    config_cls: type[StageConfig],
    *,
    produces: Literal["model", "artifacts"] = "model",
    sets_teacher: bool = False,
) -> Callable[[Handler], Handler]:
    def decorate(handler: Handler) -> Handler:
        if name in STAGES:
            raise RuntimeError(f"stage '{name}' registered twice")
        STAGES[name] = StageSpec(name, config_cls, handler, produces, sets_teacher)
        return handler

    return decorate


def get_stage(name: str) -> StageSpec:
    return STAGES[name]
