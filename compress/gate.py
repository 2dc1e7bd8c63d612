"""Gates: turn a report into pass/fail verdicts a CI job can act on.

Absolute gates compare each artifact with fixed thresholds or with the teacher; baseline gates
compare it with the same-named artifact of an older report, so a change that makes the student
worse, slower or bigger fails the build even when it is still above the absolute bar.
"""

from __future__ import annotations

import fnmatch
import logging
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from compress.errors import CompressError, GateFailure
from compress.io import atomic_path
from compress.recipe_base import BaselineGates, GatesConfig
from compress.report_file import load_report
from compress.run_layout import REPORT_FILE

Entry = dict[str, Any]
_EPS = 1e-9
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    gate: str
    artifact: str
    value: float | None
    threshold: float
    verdict: Literal["pass", "fail", "skip"]
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"

    def line(self) -> str:
        """One line for a person reading CI logs: gate, artifact, value, threshold."""
        value = "not measured" if self.value is None else _fmt(self.value)
        extra = f" ({self.detail})" if self.detail else ""
        return f"{self.gate} {self.artifact}: value {value} vs threshold {_fmt(self.threshold)}{extra}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _fmt(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.4f}".rstrip("0").rstrip(".")


def _metric(entry: Entry | None, key: str) -> float | None:
    return None if entry is None else entry.get("metrics", {}).get(key)


def _p(entry: Entry | None, pct: str) -> float | None:
    latency = _metric(entry, "latency_ms")
    return latency.get(pct) if latency else None


def _drop(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else before - after


def _speedup(entry: Entry, teacher: Entry | None) -> float | None:
    mine, theirs = _p(entry, "p50"), _p(teacher, "p50")
    return None if not mine or theirs is None else theirs / mine


# gate name -> (value of an artifact given the teacher, whether the threshold is a minimum)
ABSOLUTE: dict[str, tuple[Callable[[Entry, Entry | None], float | None], bool]] = {
    "min_accuracy": (lambda e, t: _metric(e, "accuracy"), True),
    "min_agreement": (lambda e, t: _metric(e, "agreement"), True),
    "max_accuracy_drop": (lambda e, t: _drop(_metric(t, "accuracy"), _metric(e, "accuracy")), False),
    "max_latency_p50_ms": (lambda e, t: _p(e, "p50"), False),
    "max_latency_p90_ms": (lambda e, t: _p(e, "p90"), False),
    "max_bytes": (lambda e, t: e.get("bytes"), False),
    "min_speedup": (_speedup, True),
}


def _judge(
    gate: str, name: str, value: float | None, threshold: float, is_min: bool, detail: str = ""
) -> Verdict:
    if value is None:
        return Verdict(gate, name, None, threshold, "fail", detail or "the report has no value for it")
    # accuracies are ratios of counts: a drop of exactly the threshold must not fail on float rounding
    ok = value >= threshold - _EPS if is_min else value <= threshold + _EPS
    return Verdict(gate, name, value, threshold, "pass" if ok else "fail", detail)


def _applies(entry: Entry, gates: GatesConfig | None) -> bool:
    """Whether the recipe's ``apply_to`` globs select this artifact (all of them without gates)."""
    return gates is None or any(fnmatch.fnmatchcase(entry["name"], pattern) for pattern in gates.apply_to)


def absolute_verdicts(report: dict[str, Any], gates: GatesConfig) -> list[Verdict]:
    teacher = report.get("teacher")
    out = []
    for entry in report.get("artifacts", []):
        if not _applies(entry, gates):
            continue
        for gate, (value_of, is_min) in ABSOLUTE.items():
            threshold = getattr(gates, gate)
            if threshold is not None:
                out.append(_judge(gate, entry["name"], value_of(entry, teacher), threshold, is_min))
    return out


def budget_verdicts(report: dict[str, Any], gates: GatesConfig | None = None) -> list[Verdict]:
    """Each shipped artifact against its target profile's budgets, whether or not the recipe has gates.

    With ``gates.apply_to``, only the artifacts it selects are judged: a float export that a later
    quantize stage replaces is an intermediate, not what goes on the board.

    Latency is judged on the board's own numbers when device results were merged, otherwise on
    the host's (a host usually outruns the board, so a host miss is a real miss).
    """
    on_device: dict[str, list[Entry]] = {}
    for row in report.get("device_results", []):
        on_device.setdefault(row["artifact"], []).append(row)
    out = []
    for entry in report.get("artifacts", []):
        if not _applies(entry, gates):
            continue
        budgets, name = entry.get("budgets") or {}, entry["name"]
        if "max_bytes" in budgets:
            out.append(_judge("target.max_bytes", name, entry.get("bytes"), budgets["max_bytes"], False))
        if "max_latency_p50_ms" not in budgets:
            continue
        gate, limit = "target.max_latency_p50_ms", budgets["max_latency_p50_ms"]
        for row in on_device.get(name, []):
            where = f"on {row.get('board') or row.get('cpu')} ({row.get('machine')})"
            out.append(_judge(gate, name, (row.get("latency_ms") or {}).get("p50"), limit, False, where))
        if name not in on_device:
            where = f"on host {entry.get('measured', {}).get('machine')}; no device results merged"
            out.append(_judge(gate, name, _p(entry, "p50"), limit, False, where))
    return out


def _latency_verdict(name: str, new: Entry, old: Entry, rules: BaselineGates) -> Verdict:
    gate = "baseline.max_latency_rise"
    machines = (new.get("measured", {}).get("machine"), old.get("measured", {}).get("machine"))
    now, before = _p(new, "p50"), _p(old, "p50")
    if machines[0] != machines[1]:
        return Verdict(
            gate, name, None, rules.max_latency_rise, "skip", f"measured on {machines[1]}, now {machines[0]}"
        )
    if now is None or not before:
        return _judge(gate, name, None, rules.max_latency_rise, False)
    rise = now / before - 1
    allowed = before * (1 + rules.max_latency_rise) + rules.latency_noise_ms
    detail = f"p50 {now:.2f} ms vs baseline {before:.2f} ms, noise allowance {rules.latency_noise_ms} ms"
    return Verdict(gate, name, rise, rules.max_latency_rise, "pass" if now <= allowed else "fail", detail)


def baseline_verdicts(
    report: dict[str, Any], baseline: dict[str, Any], rules: BaselineGates
) -> list[Verdict]:
    """Each artifact of the baseline against the same-named artifact now; a vanished artifact fails."""
    current = {e["name"]: e for e in report.get("artifacts", [])}
    out = []
    for old in baseline.get("artifacts", []):
        name = old["name"]
        new = current.get(name)
        if new is None:
            out.append(
                Verdict(
                    "baseline.artifact_present", name, None, 1, "fail", "in the baseline, not in this report"
                )
            )
            continue
        drop = _drop(_metric(old, "accuracy"), _metric(new, "accuracy"))
        out.append(_judge("baseline.max_accuracy_drop", name, drop, rules.max_accuracy_drop, False))
        out.append(_latency_verdict(name, new, old, rules))
        rise = new["bytes"] / old["bytes"] - 1 if old.get("bytes") and new.get("bytes") is not None else None
        out.append(_judge("baseline.max_bytes_rise", name, rise, rules.max_bytes_rise, False))
    return out


def _known_keys(config: dict[str, Any], model: type[Any], where: str) -> dict[str, Any]:
    """``config`` without keys ``model`` does not know: a newer compress may add gates (a compatible
    addition of the report schema); this version cannot judge them, so it says so and goes on."""
    known = {}
    for key, value in config.items():
        if key not in model.model_fields:
            log.warning("%s: gate %r is not known to this compress version; not judged", where, key)
        elif key == "baseline" and isinstance(value, dict):
            known[key] = _known_keys(value, BaselineGates, f"{where}.baseline")
        else:
            known[key] = value
    return known


def gates_from_report(config: Any, where: str = REPORT_FILE) -> GatesConfig | None:
    """The ``gates_config`` of a report as a ``GatesConfig``, or one line naming the bad key."""
    from pydantic import ValidationError

    from compress.io import schema_error_line

    if config is None:
        return None
    if not isinstance(config, dict):
        raise CompressError(f"{where}: gates_config must be a mapping, got {type(config).__name__}")
    try:
        return GatesConfig.model_validate(_known_keys(config, GatesConfig, f"{where} gates_config"))
    except ValidationError as exc:
        raise CompressError(
            schema_error_line(f"{where} gates_config", exc, "fix the recipe's gates and run it again")
        ) from None


def check_gates(
    report: dict[str, Any], gates: GatesConfig | dict[str, Any] | None, baseline: dict[str, Any] | None = None
) -> list[Verdict]:
    """Every verdict for ``report``: target budgets, absolute gates, then regressions against ``baseline``."""
    if isinstance(gates, dict):
        gates = gates_from_report(gates, str(report.get("run") or REPORT_FILE))
    verdicts = budget_verdicts(report, gates) + (absolute_verdicts(report, gates) if gates else [])
    if baseline is not None:
        rules = gates.baseline if gates and gates.baseline else BaselineGates()
        verdicts += baseline_verdicts(report, baseline, rules)
    return verdicts


def load_baseline(config: dict[str, Any] | None, path: str | Path | None = None) -> dict[str, Any] | None:
    """The baseline report: ``path`` if given, else the one ``gates.baseline.report`` names, else None."""

    configured = ((config or {}).get("baseline") or {}) if isinstance(config, dict) else {}
    path = path or (configured.get("report") if isinstance(configured, dict) else None)
    if not path:
        return None
    if not isinstance(path, (str, Path)):
        raise CompressError(
            f"gates_config.baseline.report: {path!r} is not a path; fix gates.baseline.report"
        )
    if not Path(path).exists() and not Path(path).is_symlink():
        raise CompressError(
            f"baseline report {path} not found; copy a good run's report.json there "
            "or remove gates.baseline.report"
        )
    return load_report(path)


def check_report_file(report_path: str | Path, baseline_path: str | Path | None = None) -> list[Verdict]:
    """``compress gate``: the report's own gates config, against ``baseline_path`` or the configured one."""
    from compress.io import require_path

    require_path(report_path, "`compress run RECIPE` writes runs/<name>/report.json")
    if baseline_path is not None:
        require_path(baseline_path, "pass --baseline an older report.json")
    report = load_report(report_path)
    config = report.get("gates_config")
    gates = gates_from_report(config, f"{report_path}")
    verdicts = check_gates(report, gates, load_baseline(config, baseline_path))
    if not verdicts:
        raise CompressError(
            f"{report_path}: no gates to check (no gates: in the recipe or none matching apply_to, no target "
            "budgets, no --baseline); add gates: to the recipe or pass --baseline OLD_REPORT"
        )
    return verdicts


def verdicts_of(report: dict[str, Any]) -> list[Verdict]:
    """The verdicts stored in a report (``compress run`` raises on them after writing the report)."""
    return [Verdict(**g) for g in report.get("gates", [])]


def raise_on_failure(verdicts: list[Verdict]) -> None:
    failed = [v.line() for v in verdicts if v.failed]
    if failed:
        raise GateFailure(failed)


def write_junit(verdicts: list[Verdict], path: str | Path) -> None:
    """JUnit XML (one test case per gate and artifact) for CI systems that display test results."""
    suite = ET.Element(
        "testsuite",
        name="compress.gates",
        tests=str(len(verdicts)),
        failures=str(sum(v.failed for v in verdicts)),
        skipped=str(sum(v.verdict == "skip" for v in verdicts)),
        errors="0",
    )
    for v in verdicts:
        case = ET.SubElement(suite, "testcase", classname=f"compress.gate.{v.gate}", name=v.artifact)
        if v.failed:
            ET.SubElement(case, "failure", message=v.line(), type=v.gate).text = v.line()
        elif v.verdict == "skip":
            ET.SubElement(case, "skipped", message=v.line())
        else:
            ET.SubElement(case, "system-out").text = v.line()
    tree = ET.ElementTree(ET.Element("testsuites"))
    tree.getroot().append(suite)
    with atomic_path(path) as tmp:
        tree.write(tmp, encoding="utf-8", xml_declaration=True)
