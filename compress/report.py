"""The run report: ``report.json`` (the record), ``report.md`` (for people), ``report.png`` (the trade-off).

This module builds and writes a report (evaluate the run, judge its gates, render, merge device
results); ``compress.report_file`` holds report.json's schema and reads it back.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from compress.errors import CompressError
from compress.io import read_json, write_json_atomic, write_text_atomic
from compress.report_file import DEVICE_SCHEMA, SCHEMA, DeviceResult, load_report
from compress.run_layout import MANIFEST_FILE, REPORT_FILE, REPORT_MARKDOWN, REPORT_PLOT

log = logging.getLogger(__name__)

REDO_DEVICE = "write it again with the bundle's `runner.py benchmark --out FILE`"


def _gates_config(recipe: Any) -> dict[str, Any] | None:
    if recipe.gates is None:
        return None
    from compress.recipe import resolve_path

    config = recipe.gates.model_dump()
    baseline = config.get("baseline") or {}
    if baseline.get("report"):
        baseline["report"] = str(resolve_path(recipe, baseline["report"]).resolve())
    return config


def evaluate_run(run_dir: str | Path, recipe: Any) -> dict[str, Any]:
    """Evaluate the run's teacher, checkpoints and artifacts (as its run.json and plan.json list them)
    on the recipe's final split."""
    from compress import __version__
    from compress.data import load_recipe_split
    from compress.evaluate import Settings, evaluate_subjects
    from compress.subjects import run_subjects

    run_dir = Path(run_dir).resolve()
    split_name = recipe.evaluate.split or ("test" if recipe.data.test is not None else "eval")
    split = load_recipe_split(recipe, split_name)
    evaluation = evaluate_subjects(run_subjects(run_dir), split, Settings.from_recipe(recipe))
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "compress_version": __version__,
        "run": str(run_dir),
        "recipe": recipe.name,
        "split": split_name,
        **evaluation,
        "device_results": [],
        "gates_config": _gates_config(recipe),
    }


def apply_gates(report: dict[str, Any]) -> None:
    """Judge ``report`` with its own gates config (and baseline report, if one is configured)."""
    from compress.gate import check_gates, load_baseline

    config = report.get("gates_config")
    verdicts = check_gates(report, config, load_baseline(config))
    report["gates"] = [v.to_json() for v in verdicts]
    report["passed"] = not any(v.failed for v in verdicts)


def write_report(run_dir: str | Path, report: dict[str, Any]) -> None:
    """report.png and report.md first, report.json last: a report.json means the set is complete. Then
    each artifact folder's model card (README.md), filled from this report."""
    from compress.model_card import write_artifact_cards
    from compress.report_render import markdown, plot

    run_dir = Path(run_dir)
    plot(report, run_dir / REPORT_PLOT)
    write_text_atomic(run_dir / REPORT_MARKDOWN, markdown(report))
    write_json_atomic(run_dir / REPORT_FILE, report)
    write_artifact_cards(report)


def build_run_report(run_dir: str | Path, recipe: Any) -> dict[str, Any]:
    """Evaluate a finished run, judge its gates and write report.json, report.md and report.png."""
    report = evaluate_run(run_dir, recipe)
    apply_gates(report)
    write_report(run_dir, report)
    return report


def fallback_shas(artifact: dict[str, Any]) -> dict[str, str]:
    """The sha256 of each fallback model of a report entry: as measured (its ``fallbacks`` rows), else
    as the artifact folder's manifest lists them; none for an older entry without a folder here."""
    from compress.subjects import artifact_fallbacks, present, read_artifact_manifest

    measured = {f["path"]: f["sha256"] for f in artifact.get("fallbacks") or [] if f.get("sha256")}
    if measured:
        return measured
    folder = Path(artifact["path"]) if isinstance(artifact.get("path"), str) else None
    if artifact.get("format") != "tflite" or folder is None or not present(folder / MANIFEST_FILE):
        return {}
    manifest = read_artifact_manifest(folder)
    files = {f.path: f.sha256 for f in manifest.files}
    return {entry.path: files[entry.path] for entry in artifact_fallbacks(folder, manifest)}


def _device_row(result: dict[str, Any], artifacts: list[dict[str, Any]], source: Path) -> dict[str, Any]:
    from pydantic import ValidationError

    from compress.io import schema_error_line

    schema = result.get("schema") if isinstance(result, dict) else type(result).__name__
    if schema != DEVICE_SCHEMA:
        raise CompressError(f"{source}: schema {schema!r} is not {DEVICE_SCHEMA!r}; {REDO_DEVICE}")
    try:
        DeviceResult.model_validate(result)
    except ValidationError as exc:
        raise CompressError(schema_error_line(source, exc, REDO_DEVICE)) from None
    sha = result.get("model_sha256")
    match = [(a, f"model.{a.get('format')}") for a in artifacts if a.get("sha256") == sha]
    if not match:  # a device whose interpreter ran the artifact's fallback model (tflite-runtime < 2.15)
        match = [(a, model) for a in artifacts for model, s in fallback_shas(a).items() if s == sha]
    if not match:
        raise CompressError(
            f"{source}: model sha256 {str(sha)[:12]}… matches no artifact of this run (model or "
            "fallback); benchmark a bundle made from this run"
        )
    artifact, model = match[0]
    device, interpreter = result.get("device") or {}, result.get("interpreter") or {}
    return {
        "artifact": artifact["name"],
        "model": model,
        "where": "device",
        "machine": device.get("machine"),
        "cpu": device.get("cpu_model"),
        "board": device.get("board"),
        "runtime": f"{interpreter.get('name')} {interpreter.get('version')}",
        "threads": result.get("threads"),
        "latency_ms": result.get("latency_ms"),
        "input_tokens": result.get("input_tokens"),
        "padded_to": result.get("padded_to"),
        "created": result.get("created"),
        "source": str(source),
    }


def merge_device_results(report: dict[str, Any], path: str | Path) -> None:
    """Add rows from a device benchmark file; a row for the same artifact, device and runtime is replaced."""
    path = Path(path)
    data = read_json(path, fix="pass the JSON from `runner.py benchmark --out FILE`", redo=REDO_DEVICE)
    if isinstance(data, list) and not data:
        raise CompressError(f"{path}: an empty list, no device results; {REDO_DEVICE}")
    rows = [
        _device_row(r, report.get("artifacts", []), path)
        for r in (data if isinstance(data, list) else [data])
    ]
    keys = ("artifact", "where", "machine", "cpu", "runtime", "threads")
    fresh = {tuple(r[k] for k in keys) for r in rows}
    kept = [r for r in report.get("device_results", []) if tuple(r.get(k) for k in keys) not in fresh]
    report["device_results"] = kept + rows


def moved_since(report: dict[str, Any], run_dir: Path) -> None:
    """Point a report read from a run folder that was moved since it was written at the folder it is in
    now: its ``run`` and each entry's ``path`` inside the old folder (so model cards go to the right
    place). Paths outside the run (a recipe teacher) stay."""
    old, new = report.get("run"), run_dir.resolve()
    if not isinstance(old, str) or not old or Path(old) == new:
        return
    report["run"] = str(new)
    entries = [report.get("teacher"), *report.get("checkpoints", []), *report.get("artifacts", [])]
    for entry in entries:
        path = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(path, str) and Path(path).is_relative_to(old):
            entry["path"] = str(new / Path(path).relative_to(old))


def regenerate(run_dir: str | Path, device_results: str | Path | None = None) -> dict[str, Any]:
    """Rewrite a run's report files, merging device results; evaluate only if there is no report.json."""
    from compress.io import require_path

    run_dir = require_path(run_dir, "point at a run folder (runs/<name>)")
    if device_results is not None:
        require_path(device_results, "pass the JSON from `runner.py benchmark --out FILE`")
    report_path = run_dir / REPORT_FILE
    if report_path.exists() or report_path.is_symlink():
        report = load_report(report_path, shown=True)
        moved_since(report, run_dir)
    else:
        from compress.subjects import recipe_of_run

        report = evaluate_run(run_dir, recipe_of_run(run_dir, data=True))
    if device_results is not None:
        merge_device_results(report, device_results)
    apply_gates(report)
    write_report(run_dir, report)
    return report
