"""The stage contract: a pydantic config per stage type and one handler function, joined by name.

A handler takes a ``StageContext`` and returns a ``StageResult`` (``compress.stage_context``, where
the algorithms a handler calls also find them); ``StageSpec`` is what the registry keeps per name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from compress.stage_context import StageConfig, StageContext, StageResult

__all__ = ["Handler", "StageConfig", "StageContext", "StageResult", "StageSpec"]


Handler = Callable[[StageContext], StageResult]


@dataclass(frozen=True)
class StageSpec:
    name: str
    config_cls: type[StageConfig]
    run: Handler
    produces: Literal["model", "artifacts"]
    """``model``: ``out_dir`` is a Hugging Face checkpoint; ``artifacts``: one folder per artifact."""
    sets_teacher: bool
    """The output becomes the teacher for later stages (``finetune``)."""
