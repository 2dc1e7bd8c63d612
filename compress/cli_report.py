"""``compress eval``, ``compress report`` and ``compress gate``: parse, call one library function, print.

Errors are raised as ``CompressError`` (exit 2) and failed gates as ``GateFailure`` (exit 1); the
``compress`` group maps both to one line each on stderr.
"""

from __future__ import annotations

from pathlib import Path

import click

from compress.run_layout import REPORT_MARKDOWN

_existing = click.Path(path_type=Path)
"""Existence is checked by compress itself, which names the real cause (a symlink loop is not 'missing')."""


def summary(result: dict) -> str:
    """The quality and cost tables of an evaluation or report, as Markdown for a terminal."""
    from compress.report_render import cost_table, quality_table

    return "\n".join([*quality_table(result), "", *cost_table(result)])


@click.command("eval")
@click.argument("target", metavar="ARTIFACT_OR_RUN", type=_existing)
@click.option("--data", required=True, type=_existing, help="TSV/CSV/JSONL file to evaluate on.")
@click.option("--text", default="text", show_default=True, help="Column with the text.")
@click.option("--text-pair", default=None, help="Column with the second text of a pair task.")
@click.option("--label", default="label", show_default=True, help="Column with the gold label.")
@click.option("--teacher", type=_existing, help="Checkpoint to measure fidelity against (replaces a run's).")
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write the full results here.")
def eval_command(
    target: Path,
    data: Path,
    text: str,
    text_pair: str | None,
    label: str,
    teacher: Path | None,
    json_out: Path | None,
) -> None:
    """Evaluate an artifact, checkpoint or run on DATA through each model's own runtime."""
    from compress.evaluate import evaluate_path
    from compress.io import check_output_path, write_json_atomic

    if json_out is not None:
        check_output_path(json_out)
    result = evaluate_path(target, data, text=text, text_pair=text_pair, label=label, teacher=teacher)
    if json_out is not None:
        write_json_atomic(json_out, result)
    click.echo(summary(result))


@click.command("report")
@click.argument("run", type=_existing)
@click.option(
    "--device-results",
    type=_existing,
    help="JSON from a bundle's `runner.py benchmark --out FILE`, merged as measured-on-device rows.",
)
def report_command(run: Path, device_results: Path | None) -> None:
    """Regenerate RUN/report.json, report.md and report.png (re-judging the gates)."""
    from compress.report import regenerate

    report = regenerate(run, device_results)
    failed = sum(g["verdict"] == "fail" for g in report.get("gates", []))
    gates = f"{len(report.get('gates', []))} gates, {failed} failed" if report.get("gates") else "no gates"
    click.echo(f"{run / REPORT_MARKDOWN}: {len(report.get('artifacts', []))} artifacts, {gates}")


@click.command("gate")
@click.argument("report", type=_existing)
@click.option("--baseline", type=_existing, help="An older report.json to check for regressions against.")
@click.option("--junit", type=click.Path(path_type=Path), help="Write the verdicts as JUnit XML here.")
def gate_command(report: Path, baseline: Path | None, junit: Path | None) -> None:
    """Check REPORT against its recipe's gates (and a baseline); exit 1 if any gate fails."""
    from compress.gate import check_report_file, raise_on_failure, write_junit
    from compress.io import check_output_path

    if junit is not None:
        check_output_path(junit)
    verdicts = check_report_file(report, baseline)
    if junit is not None:
        write_junit(verdicts, junit)
    count = {kind: sum(v.verdict == kind for v in verdicts) for kind in ("pass", "fail", "skip")}
    passed, failed, skipped = (count[k] for k in ("pass", "fail", "skip"))
    click.echo(f"{len(verdicts)} gates: {passed} passed, {failed} failed, {skipped} skipped")
    raise_on_failure(verdicts)


COMMANDS = (eval_command, report_command, gate_command)
