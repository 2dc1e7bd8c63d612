"""compress: turn a fine-tuned transformer text classifier into small, fast, verified artifacts."""

from __future__ import annotations

__version__ = "0.1.0"
