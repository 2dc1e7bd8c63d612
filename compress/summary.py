"""The short table ``compress run`` prints at the end."""

from __future__ import annotations

from typing import Any

from compress.run_layout import REPORT_MARKDOWN, REPORT_PLOT

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
    if result.report:
        lines.append("")
        lines.extend(_report_rows(result.report))
        lines.append(f"report: {result.run_dir / REPORT_MARKDOWN} (plot: {REPORT_PLOT})")
    return "\n".join(lines)


def _report_rows(report: dict[str, Any]) -> list[str]:
    """Teacher and artifacts on the held-out split: accuracy, agreement, p50 latency, size."""
    rows = [f"  {'model':44} {'accuracy':>8} {'agree':>6} {'p50 ms':>7} {'MB':>7}"]
    entries = [report["teacher"], *report.get("checkpoints", []), *report.get("artifacts", [])]
    for entry in entries:
        metrics = entry.get("metrics", {})
        latency = (metrics.get("latency_ms") or {}).get("p50")
        agreement = metrics.get("agreement")
        rows.append(
            f"  {entry['name'][:44]:44} {metrics.get('accuracy', float('nan')):8.4f} "
            f"{'' if agreement is None else f'{agreement:6.3f}':>6} "
            f"{'' if latency is None else f'{latency:7.2f}':>7} {entry.get('bytes', 0) / 1e6:7.2f}"
        )
    gates = report.get("gates", [])
    if gates:
        failed = sum(g["verdict"] == "fail" for g in gates)
        rows.append(f"gates: {len(gates) - failed} of {len(gates)} passed")
    return rows
