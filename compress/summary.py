"""The short table ``compress run`` prints at the end."""

from __future__ import annotations

from typing import Any

_KEYS = ("accuracy", "eval_accuracy", "agreement", "parameters", "bytes")


def _headline(metrics: dict[str, Any]) -> str:
    parts = []
    for key in _KEYS:
        value = metrics.get(key)
        if isinstance(value, float):
            parts.append(f"{key}={value:.4f}")
        elif isinstance(value, int):
            parts.append(f"{key}={value:,}")
    return " ".join(parts)


def summary_table(result: Any) -> str:
    lines = [f"run: {result.run_dir}"]
    for stage in result.stages:
        status = "reused" if stage.reused else f"{stage.seconds:.1f}s"
        lines.append(f"  {stage.dir.name:24} {status:>9}  {_headline(stage.metrics)}")
    return "\n".join(lines)
