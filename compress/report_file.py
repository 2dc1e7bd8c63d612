"""``report.json``, the run report's record, as read back: its schema, checked when loaded.

Building and writing a report is ``compress.report``; this module is what the gates, the bundle
and the report itself read, so it sits below all three.

Schema ``compress.report/1`` (top-level keys of report.json):

- ``schema``, ``created`` (UTC ISO time), ``compress_version``, ``run`` (run folder), ``recipe`` (name),
  ``split`` (which recipe split was evaluated), ``data`` {source, sha256, rows, labels, pairs, gold (the
  gold label id of every row, in row order; None for unlabelled data)}, ``host`` {machine, cpus}.
- ``teacher``: one entry; ``checkpoints``: entries for models that stages produced (distill, share);
  ``artifacts``: entries for every exported/quantized file. An entry is {name, role, path, format
  (torch|onnx|tflite), target, precision, bytes (weights the runtime loads), total_bytes (whole folder),
  sha256 (of the model file), parameters, max_length, measured {where: host, machine, system, runtime,
  threads, scored_batch_size (1: the quality metrics come from one request per row, as a device
  serves them; added within version 1)}, metrics {accuracy, macro_f1, f1 (two labels: positive class =
  id 1), per_class {label: {support, predicted, correct}}, agreement, mean_kl, max_abs_logit_diff (vs
  the teacher), latency_ms {p50, p90, p99, mean, samples, warmup, threads, padded_to}, throughput {batch_size,
  items_per_s, runtime_batch}, peak_rss_bytes, rss_before_load_bytes, accuracy_vs_teacher {method,
  confidence, resamples, seed, rows, diff_points, ratio}}, predictions (the label id predicted for every
  row, in row order), fallbacks (a TFLite artifact's fallback models, each measured on the host:
  {path, interpreter, below, scheme, bytes, sha256, measured, metrics, predictions})}; artifacts with a
  target also carry ``budgets`` (the profile's max_bytes /
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

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, Strict, StrictBool, StrictInt, StrictStr

from compress.config import Open
from compress.errors import BadFile, CompressError
from compress.io import check_model, read_json
from compress.run_layout import REPORT_FILE

SCHEMA = "compress.report/1"
DEVICE_SCHEMA = "compress.device-benchmark/1"
REDO_REPORT = "delete it and run `compress report RUN` to evaluate the run again"

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


class FallbackRow(Open):
    """A TFLite artifact's fallback model, measured on the host beside its primary."""

    path: StrictStr
    interpreter: StrictStr | None = None
    below: StrictStr | None = None
    scheme: StrictStr | None = None
    bytes: Num = None
    sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    metrics: Metrics
    predictions: list[LabelId] | None = None


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
    fallbacks: list[FallbackRow] | None = None


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
        path = path / REPORT_FILE
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
    for i, e in enumerate(checked.artifacts):
        fallbacks = enumerate(e.fallbacks or [])
        found += [(f"artifacts[{i}].fallbacks[{j}].predictions", f.predictions) for j, f in fallbacks]
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
