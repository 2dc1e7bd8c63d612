"""Stage registry: a decorator into a dict keyed by name.

Stage modules are imported explicitly at the bottom (no package scanning), so an import error in
one of them surfaces instead of silently dropping the stage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from compress.stages.base import Handler, StageConfig, StageContext, StageResult, StageSpec

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


__all__ = ["STAGES", "StageConfig", "StageContext", "StageResult", "StageSpec", "get_stage", "register_stage"]

from compress.stages import (  # noqa: E402
    distill,  # noqa: F401
    export,  # noqa: F401
    finetune,  # noqa: F401
    quantize,  # noqa: F401
    share,  # noqa: F401
)
