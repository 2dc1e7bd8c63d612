"""compress: turn a fine-tuned transformer text classifier into small, fast, verified artifacts.

The Python API (``compress.api``) is also reachable from here, loaded on first use so that
``import compress`` stays as light as the CLI needs: ``compress.distill(...)``, ``compress.run(...)``.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"
_API = ("run", "distill", "share", "export", "quantize", "evaluate", "run_stage", "Output", "Evaluation")
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> object:
    # importlib rather than an import statement: modules below compress.api import this package for
    # __version__, and a static edge from here to the API would read as them importing the API.
    if name in _API:
        return getattr(importlib.import_module("compress.api"), name)
    raise AttributeError(f"module 'compress' has no attribute {name!r}")
