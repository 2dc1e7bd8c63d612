"""Stage registry: a decorator into a dict keyed by name (``compress.stages.registry``).

Stage modules are imported explicitly here (no package scanning), so an import error in one of
them surfaces instead of silently dropping the stage.
"""

from __future__ import annotations

from compress.stages import (
    distill,  # noqa: F401
    export,  # noqa: F401
    finetune,  # noqa: F401
    quantize,  # noqa: F401
    share,  # noqa: F401
)
from compress.stages.registry import STAGES, get_stage, register_stage

__all__ = ["STAGES", "get_stage", "register_stage"]
