"""Gates: each absolute gate, the baseline comparison, the CLI exit codes and the JUnit XML."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from compress.cli import Group
from compress.cli_report import COMMANDS
from compress.errors import CompressError, GateFailure
from compress.gate import check_gates, check_report_file, raise_on_failure, write_junit
from compress.recipe_base import GatesConfig
from compress.report import SCHEMA


def entry(
    name: str,
    *,
    accuracy: float,
    p50: float,
    size: int,
    agreement: float | None = None,
    machine: str = "x86_64",
) -> dict:
    metrics = {"accuracy": accuracy, "latency_ms": {"p50": p50, "p90": p50 * 1.5, "p99": p50 * 2}}
    if agreement is not None:
        metrics["agreement"] = agreement
    return {"name": name, "bytes": size, "measured": {"machine": machine}, "metrics": metrics}


def make_report(**overrides) -> dict:
    report = {
        "schema": SCHEMA,
        "teacher": entry("teacher", accuracy=0.90, p50=40.0, size=90_000_000),
        "artifacts": [
            entry("03-export/pi4-int8", accuracy=0.88, p50=8.0, size=6_000_000, agreement=0.95),
            entry("03-export/onnx-fp32", accuracy=0.895, p50=20.0, size=25_000_000, agreement=0.99),
        ],
    }
    report.update(overrides)
    return report


def by_key(verdicts) -> dict:
    return {(v.gate, v.artifact): v for v in verdicts}


@pytest.mark.parametrize(
    ("gate", "threshold", "int8_verdict", "value"),
    [
        ("min_accuracy", 0.885, "fail", 0.88),
        ("min_accuracy", 0.88, "pass", 0.88),
        ("min_agreement", 0.96, "fail", 0.95),
        ("max_accuracy_drop", 0.01, "fail", 0.02),
        ("max_accuracy_drop", 0.03, "pass", 0.02),
        ("max_accuracy_drop", 0.02, "pass", 0.02),  # 0.90 - 0.88 is 0.020000000000000018 in floats
        ("max_latency_p50_ms", 7.5, "fail", 8.0),
        ("max_latency_p90_ms", 12.0, "pass", 12.0),
        ("max_bytes", 5_000_000, "fail", 6_000_000),
        ("min_speedup", 4.0, "pass", 5.0),
        ("min_speedup", 6.0, "fail", 5.0),
    ],
)
def test_each_absolute_gate_judges_the_artifact(gate, threshold, int8_verdict, value):
    verdicts = by_key(check_gates(make_report(), GatesConfig(**{gate: threshold})))
    v = verdicts[(gate, "03-export/pi4-int8")]
    assert v.verdict == int8_verdict
    assert v.value == pytest.approx(value)
    assert v.threshold == threshold


def test_apply_to_limits_absolute_gates_to_matching_artifacts():
    verdicts = check_gates(make_report(), GatesConfig(apply_to=["*-int8"], max_bytes=10_000_000))
    assert [(v.artifact, v.verdict) for v in verdicts] == [("03-export/pi4-int8", "pass")]


def test_a_gate_without_a_measured_value_fails():
    report = make_report()
    del report["artifacts"][0]["metrics"]["agreement"]
    v = by_key(check_gates(report, GatesConfig(min_agreement=0.5)))[("min_agreement", "03-export/pi4-int8")]
    assert v.failed and v.value is None
    assert "not measured" in v.line()


def test_failure_line_names_gate_artifact_value_and_threshold():
    verdicts = check_gates(make_report(), {"max_bytes": 10_000_000, "min_accuracy": 0.89})
    with pytest.raises(GateFailure) as info:
        raise_on_failure(verdicts)
    assert info.value.lines == [
        "min_accuracy 03-export/pi4-int8: value 0.88 vs threshold 0.89",
        "max_bytes 03-export/onnx-fp32: value 25000000 vs threshold 10000000",
    ]


def test_baseline_catches_accuracy_latency_and_size_regressions():
    baseline = make_report()
    now = make_report()
    slower = now["artifacts"][0]
    slower["metrics"]["accuracy"] = 0.86
    slower["metrics"]["latency_ms"]["p50"] = 12.0
    slower["bytes"] = 6_300_000
    verdicts = by_key(check_gates(now, None, baseline))
    name = "03-export/pi4-int8"
    assert verdicts[("baseline.max_accuracy_drop", name)].failed
    assert verdicts[("baseline.max_accuracy_drop", name)].value == pytest.approx(0.02)
    assert verdicts[("baseline.max_latency_rise", name)].failed
    assert verdicts[("baseline.max_latency_rise", name)].value == pytest.approx(0.5)
    assert verdicts[("baseline.max_bytes_rise", name)].failed
    other = "03-export/onnx-fp32"
    assert all(
        verdicts[(g, other)].verdict == "pass"
        for g in ("baseline.max_accuracy_drop", "baseline.max_latency_rise", "baseline.max_bytes_rise")
    )


def test_latency_noise_allowance_absorbs_small_absolute_rises():
    baseline = make_report()
    now = copy.deepcopy(baseline)
    rules = {"baseline": {"max_latency_rise": 0.25, "latency_noise_ms": 1.0}}  # allowed: 8 * 1.25 + 1 = 11 ms
    key = ("baseline.max_latency_rise", "03-export/pi4-int8")
    now["artifacts"][0]["metrics"]["latency_ms"]["p50"] = 10.5  # +31%, but within the noise allowance
    v = by_key(check_gates(now, rules, baseline))[key]
    assert v.verdict == "pass" and v.value == pytest.approx(0.3125)
    now["artifacts"][0]["metrics"]["latency_ms"]["p50"] = 11.2
    assert by_key(check_gates(now, rules, baseline))[key].failed
    rules["baseline"]["latency_noise_ms"] = 0.0
    now["artifacts"][0]["metrics"]["latency_ms"]["p50"] = 10.5
    assert by_key(check_gates(now, rules, baseline))[key].failed


def test_baseline_latency_from_another_machine_is_skipped_not_compared():
    baseline = make_report()
    for e in baseline["artifacts"]:
        e["measured"]["machine"] = "aarch64"
    verdicts = by_key(check_gates(make_report(), None, baseline))
    v = verdicts[("baseline.max_latency_rise", "03-export/pi4-int8")]
    assert v.verdict == "skip" and "aarch64" in v.detail


def test_an_artifact_missing_from_the_new_report_fails():
    now = make_report()
    now["artifacts"].pop(1)
    verdicts = by_key(check_gates(now, None, make_report()))
    assert verdicts[("baseline.artifact_present", "03-export/onnx-fp32")].failed


def test_junit_xml_parses_back_with_failures_and_skips(tmp_path: Path):
    baseline = make_report()
    baseline["artifacts"][1]["measured"]["machine"] = "aarch64"
    verdicts = check_gates(make_report(), {"max_bytes": 10_000_000}, baseline)
    write_junit(verdicts, tmp_path / "gates.xml")
    suite = ET.parse(tmp_path / "gates.xml").getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases) == len(verdicts)
    failed = [c for c in cases if c.find("failure") is not None]
    assert [(c.get("classname"), c.get("name")) for c in failed] == [
        ("compress.gate.max_bytes", "03-export/onnx-fp32")
    ]
    assert "value 25000000 vs threshold 10000000" in failed[0].find("failure").get("message")
    assert int(suite.get("failures")) == 1
    assert int(suite.get("skipped")) == 1


def _cli() -> click.Group:
    @click.group(cls=Group)
    def cli() -> None:
        pass

    for command in COMMANDS:
        cli.add_command(command)
    return cli


def _write(path: Path, report: dict) -> Path:
    path.write_text(json.dumps(report))
    return path


def test_gate_command_exit_codes_and_messages(tmp_path: Path):
    runner = CliRunner()
    passing = _write(tmp_path / "ok.json", make_report(gates_config={"max_bytes": 30_000_000}))
    result = runner.invoke(_cli(), ["gate", str(passing), "--junit", str(tmp_path / "j.xml")])
    assert result.exit_code == 0, result.output
    assert "2 gates: 2 passed, 0 failed" in result.output
    assert (tmp_path / "j.xml").is_file()

    failing = _write(tmp_path / "bad.json", make_report(gates_config={"max_bytes": 10_000_000}))
    result = runner.invoke(_cli(), ["gate", str(failing)])
    assert result.exit_code == 1
    assert "gate failed: max_bytes 03-export/onnx-fp32: value 25000000 vs threshold 10000000" in result.output

    old = make_report()
    old["artifacts"][0]["metrics"]["accuracy"] = 0.95
    result = runner.invoke(
        _cli(), ["gate", str(passing), "--baseline", str(_write(tmp_path / "old.json", old))]
    )
    assert result.exit_code == 1
    assert "baseline.max_accuracy_drop 03-export/pi4-int8" in result.output

    ungated = _write(tmp_path / "none.json", make_report())
    result = runner.invoke(_cli(), ["gate", str(ungated)])
    assert result.exit_code == 2 and "no gates to check" in result.output

    wrong = _write(tmp_path / "wrong.json", {"schema": "something/9"})
    result = runner.invoke(_cli(), ["gate", str(wrong)])
    assert result.exit_code == 2 and "compress.report/1" in result.output


def test_configured_baseline_that_does_not_exist_is_an_input_error(tmp_path: Path):
    report = _write(
        tmp_path / "r.json", make_report(gates_config={"baseline": {"report": str(tmp_path / "no.json")}})
    )
    with pytest.raises(CompressError, match=r"no\.json not found"):
        check_report_file(report)


def test_target_budgets_are_checked_without_recipe_gates_and_prefer_device_latency():
    report = make_report()
    report["artifacts"][0]["budgets"] = {"max_bytes": 5_000_000, "max_latency_p50_ms": 10.0}
    verdicts = by_key(check_gates(report, None))
    assert verdicts[("target.max_bytes", "03-export/pi4-int8")].failed
    host = verdicts[("target.max_latency_p50_ms", "03-export/pi4-int8")]
    assert host.verdict == "pass" and host.value == 8.0 and "host x86_64" in host.detail
    assert ("target.max_bytes", "03-export/onnx-fp32") not in verdicts  # no target budgets, no verdict

    report["device_results"] = [
        {
            "artifact": "03-export/pi4-int8",
            "board": "Raspberry Pi 4",
            "machine": "aarch64",
            "latency_ms": {"p50": 31.0},
        }
    ]
    device = by_key(check_gates(report, None))[("target.max_latency_p50_ms", "03-export/pi4-int8")]
    assert device.failed and device.value == 31.0 and "Raspberry Pi 4" in device.detail


def test_target_budgets_follow_apply_to():
    """A float intermediate that the recipe's apply_to leaves out is not judged against the budget."""
    report = make_report()
    for entry in report["artifacts"]:
        entry["budgets"] = {"max_bytes": 1}
    names = [entry["name"] for entry in report["artifacts"]]
    verdicts = by_key(check_gates(report, GatesConfig(apply_to=["*int8*"])))
    judged = {artifact for gate, artifact in verdicts if gate == "target.max_bytes"}
    assert judged == {name for name in names if "int8" in name} and judged != set(names)
