"""The run report: ``report.json`` (the record), ``report.md`` (for people), ``report.png`` (the trade-off).

Schema ``compress.report/1`` (top-level keys of report.json):

- ``schema``, ``created`` (UTC ISO time), ``compress_version``, ``run`` (run folder), ``recipe`` (name),
  ``split`` (which recipe split was evaluated), ``data`` {source, sha256, rows, labels, pairs, gold (the
  gold label id of every row, in row order; None for unlabelled data)}, ``host`` {machine, cpus}.
- ``teacher``: one entry; ``checkpoints``: entries for models that stages produced (distill, share);
  ``artifacts``: entries for every exported/quantized file. An entry is {name, role, path, format
  (torch|onnx|tflite), target, precision, bytes (weights the runtime loads), total_bytes (whole folder),
  sha256 (of the model file), parameters, max_length, measured {where: host, machine, system, runtime,
  threads}, metrics {accuracy, macro_f1, f1 (two labels: positive class = id 1), per_class {label:
  {support, predicted, correct}}, agreement, mean_kl, max_abs_logit_diff (vs the teacher),
  latency_ms {p50, p90, p99, mean, samples, warmup, threads, padded_to}, throughput {batch_size,
  items_per_s, runtime_batch}, peak_rss_bytes, rss_before_load_bytes, accuracy_vs_teacher {method,
  confidence, resamples, seed, rows, diff_points, ratio}}, predictions (the label id predicted for every
  row, in row order)}; artifacts with a target also carry ``budgets`` (the profile's max_bytes /
  max_latency_p50_ms), gated as ``target.*``. ``accuracy_vs_teacher`` is the paired bootstrap interval
  of the accuracy kept (``compress.metrics.paired_accuracy_interval``): ``diff_points`` (accuracy minus
  the teacher's, in points) and ``ratio`` (accuracy over the teacher's), each {estimate, low, high}.
  ``gold``, ``predictions`` and ``accuracy_vs_teacher`` were added within version 1: a report without
  them still reads, and shows no interval.
- ``device_results``: rows measured on a board (``compress report --device-results``): {artifact, model
  (the model file that ran: model.<format>, or a fallback such as fallback-weight-only.tflite), where
  (device), machine, cpu, board, runtime, threads, latency_ms, input_tokens, padded_to, created,
  source}.
- ``gates_config``: the recipe's ``gates`` (baseline path resolved), so ``compress gate`` needs no recipe;
  ``gates``: [{gate, artifact, value, threshold, verdict (pass|fail|skip), detail}]; ``passed``.

Additions keep the version; a renamed or removed key bumps it to ``compress.report/2``. So a reader
checks the keys it uses (``ReportFile``) and keeps any others.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, Strict, StrictBool, StrictInt, StrictStr

from compress.errors import BadFile, CompressError
from compress.io import check_model, read_json, write_json_atomic, write_text_atomic
from compress.subjects import Open

log = logging.getLogger(__name__)

SCHEMA = "compress.report/1"
DEVICE_SCHEMA = "compress.device-benchmark/1"
REDO_REPORT = "delete it and run `compress report RUN` to evaluate the run again"
REDO_DEVICE = "write it again with the bundle's `runner.py benchmark --out FILE`"

Num = Annotated[float, Strict()] | None
"""A measured number (int or float, never a string or bool), or None when not measured."""
Scalar = StrictStr | StrictInt | Annotated[float, Strict()] | StrictBool | None
"""A value shown in a table or used as part of a key (never a list or object)."""
LabelId = Annotated[int, Strict(), Field(ge=0)]
"""A label id of one row (an index into ``data.labels``; the upper bound is checked against them)."""


class Latency(Open):
    """Milliseconds per request; what the gates and tables read is numeric, the rest is kept as is."""

    p50: Num = None
    p90: Num = None
    p99: Num = None
    mean: Num = None
    min: Num = None
    max: Num = None
    padded_to: list[StrictInt] | StrictInt | None = None


class Throughput(Open):
    batch_size: Num = None
    items_per_s: Num = None
    runtime_batch: Num = None


class Bounds(Open):
    estimate: Annotated[float, Strict()]
    low: Annotated[float, Strict()]
    high: Annotated[float, Strict()]


class AccuracyVsTeacher(Open):
    """The paired bootstrap interval of the accuracy kept, as ``paired_accuracy_interval`` writes it."""

    confidence: Annotated[float, Strict(), Field(gt=0, lt=1)]
    resamples: Annotated[int, Strict(), Field(ge=1)]
    seed: StrictInt | None = None
    rows: StrictInt | None = None
    diff_points: Bounds
    ratio: Bounds | None = None


class Metrics(Open):
    accuracy: Num = None
    f1: Num = None
    macro_f1: Num = None
    agreement: Num = None
    mean_kl: Num = None
    max_abs_logit_diff: Num = None
    peak_rss_bytes: Num = None
    latency_ms: Latency | None = None
    throughput: Throughput | None = None
    per_class: dict[str, dict[str, Num]] | None = None
    accuracy_vs_teacher: AccuracyVsTeacher | None = None


class Entry(Open):
    """What the gates read of a report entry."""

    name: StrictStr
    role: StrictStr | None = None
    format: StrictStr | None = None
    target: StrictStr | None = None
    precision: StrictStr | None = None
    bytes: Num = None
    parameters: Num = None
    metrics: Metrics
    measured: dict[str, Any] = Field(default_factory=dict)
    budgets: dict[str, Annotated[float, Strict()]] | None = None
    predictions: list[LabelId] | None = None


class ShownEntry(Entry):
    """What report.md and report.png also need: every entry compress writes has these."""

    role: StrictStr
    format: StrictStr
    bytes: Annotated[float, Strict(), Field(ge=0)]


class DeviceRow(Open):
    artifact: StrictStr
    where: StrictStr
    runtime: StrictStr
    machine: Scalar = None
    cpu: Scalar = None
    board: Scalar = None
    threads: Scalar = None
    latency_ms: Latency


class GateRow(Open):
    gate: StrictStr
    artifact: StrictStr
    value: Num
    threshold: Annotated[float, Strict()]
    verdict: Literal["pass", "fail", "skip"]
    detail: StrictStr = ""


class ReportData(Open):
    labels: list[StrictStr] = Field(default_factory=list)
    gold: list[LabelId] | None = None


class ReportFile(Open):
    """report.json as far as compress uses it; unknown keys (a newer minor version's) are kept."""

    schema_: Literal["compress.report/1"] = Field(alias="schema")
    data: ReportData = Field(default_factory=lambda: ReportData())
    teacher: Entry | None = None
    checkpoints: list[Entry] = Field(default_factory=list)
    artifacts: list[Entry] = Field(default_factory=list)
    device_results: list[DeviceRow] = Field(default_factory=list)
    gates_config: dict[str, Any] | None = None
    gates: list[GateRow] = Field(default_factory=list)


class ShownReport(ReportFile):
    """A report that ``compress report`` renders again (report.md, report.png)."""

    teacher: ShownEntry | None = None
    checkpoints: list[ShownEntry] = Field(default_factory=list)
    artifacts: list[ShownEntry] = Field(default_factory=list)


class DeviceResult(Open):
    """One result of the runner's ``benchmark --out``."""

    schema_: Literal["compress.device-benchmark/1"] = Field(alias="schema")
    model_sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]
    device: dict[str, Scalar] = Field(default_factory=dict)
    interpreter: dict[str, Scalar] = Field(default_factory=dict)
    threads: StrictInt | None = None
    latency_ms: Latency
    created: Scalar = None
    input_tokens: dict[str, Num] | None = None
    padded_to: list[StrictInt] | None = None


def load_report(path: str | Path, *, shown: bool = False) -> dict[str, Any]:
    """A report.json checked against ``ReportFile`` (``ShownReport`` when it will be rendered again);
    the dict as written, with any keys a newer minor version added."""
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    report = read_json(path, fix="`compress run RECIPE` writes runs/<name>/report.json", redo=REDO_REPORT)
    schema = report.get("schema") if isinstance(report, dict) else type(report).__name__
    if schema != SCHEMA:
        raise CompressError(
            f"{path}: schema {schema!r} is not {SCHEMA!r}; read it with the compress that wrote it, "
            f"or {REDO_REPORT}"
        )
    checked = check_model(path, report, ShownReport if shown else ReportFile, redo=REDO_REPORT)
    check_label_ids(path, report, checked)
    return report  # the dict read above


def check_label_ids(path: Path, report: dict[str, Any], checked: ReportFile) -> None:
    """Per-row label ids (``data.gold``, each entry's ``predictions``) cover ``data.rows`` rows with ids
    of ``data.labels``: an interval computed from a list that is short or names a label that does not
    exist would look like evidence and be none."""
    found = [("data.gold", checked.data.gold)]
    if checked.teacher is not None:
        found.append(("teacher.predictions", checked.teacher.predictions))
    for group in ("checkpoints", "artifacts"):
        found += [(f"{group}[{i}].predictions", e.predictions) for i, e in enumerate(getattr(checked, group))]
    found = [(key, ids) for key, ids in found if ids is not None]
    if not found:
        return
    rows = (report.get("data") or {}).get("rows")
    if not isinstance(rows, int) or isinstance(rows, bool):
        raise BadFile(
            f"{path}: data.rows: must be the row count that {found[0][0]} covers "
            f"(got {'no value' if rows is None else type(rows).__name__}); {REDO_REPORT}"
        )
    labels = len(checked.data.labels)
    for key, ids in found:
        if len(ids) != rows:
            raise BadFile(f"{path}: {key}: {len(ids)} label ids for {rows} rows (data.rows); {REDO_REPORT}")
        bad = next((i for i, value in enumerate(ids) if value >= labels), None) if labels else None
        if bad is not None:
            raise BadFile(
                f"{path}: {key}[{bad}]: label id {ids[bad]} is out of range for the {labels} labels "
                f"of data.labels; {REDO_REPORT}"
            )


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
    """Evaluate the run's teacher, checkpoints and artifacts on the recipe's final split."""
    from compress import __version__
    from compress.data import load_recipe_split
    from compress.evaluate import Settings, evaluate_subjects
    from compress.subjects import run_subjects

    run_dir = Path(run_dir).resolve()
    split_name = recipe.evaluate.split or ("test" if recipe.data.test is not None else "eval")
    split = load_recipe_split(recipe, split_name)
    evaluation = evaluate_subjects(run_subjects(run_dir, recipe), split, Settings.from_recipe(recipe))
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
    """report.png and report.md first, report.json last: a report.json means the set is complete."""
    from compress.report_render import markdown, plot

    run_dir = Path(run_dir)
    plot(report, run_dir / "report.png")
    write_text_atomic(run_dir / "report.md", markdown(report))
    write_json_atomic(run_dir / "report.json", report)


def build_run_report(run_dir: str | Path, recipe: Any) -> dict[str, Any]:
    """Evaluate a finished run, judge its gates and write report.json, report.md and report.png."""
    report = evaluate_run(run_dir, recipe)
    apply_gates(report)
    write_report(run_dir, report)
    return report


def fallback_shas(artifact: dict[str, Any]) -> dict[str, str]:
    """The sha256 of each fallback model the artifact folder's manifest lists (``fallbacks``, their
    hashes from ``files``); none for an entry without a folder on this machine."""
    from compress.bundle import check_fallbacks
    from compress.subjects import present, read_artifact_manifest

    folder = Path(artifact["path"]) if isinstance(artifact.get("path"), str) else None
    if artifact.get("format") != "tflite" or folder is None or not present(folder / "manifest.json"):
        return {}
    manifest = read_artifact_manifest(folder)
    files = {f.path: f.sha256 for f in manifest.files}
    raw = manifest.model_dump(by_alias=True)
    check_fallbacks(folder, raw, set(files))
    return {entry["path"]: files[entry["path"]] for entry in raw.get("fallbacks") or []}


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


def regenerate(run_dir: str | Path, device_results: str | Path | None = None) -> dict[str, Any]:
    """Rewrite a run's report files, merging device results; evaluate only if there is no report.json."""
    from compress.io import require_path

    run_dir = require_path(run_dir, "point at a run folder (runs/<name>)")
    if device_results is not None:
        require_path(device_results, "pass the JSON from `runner.py benchmark --out FILE`")
    report_path = run_dir / "report.json"
    if report_path.exists() or report_path.is_symlink():
        report = load_report(report_path, shown=True)
    else:
        from compress.subjects import recipe_of_run

        report = evaluate_run(run_dir, recipe_of_run(run_dir))
    if device_results is not None:
        merge_device_results(report, device_results)
    apply_gates(report)
    write_report(run_dir, report)
    return report
