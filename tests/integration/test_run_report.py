"""`compress run` ends with report.json, report.md and report.png, and exits 1 when a gate fails."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from compress.cli import main
from compress.report import SCHEMA
from tests.helpers.tiny import write_recipe

STAGES = "  - type: finetune\n  - type: export\n"
GATES = """targets: [arm64-onnx]
evaluate: {latency_samples: 5, warmup: 1, throughput_batch: 8}
gates:
  max_bytes: 1000
  min_agreement: 0.9
"""


@pytest.mark.slow
def test_run_writes_the_report_and_fails_on_a_gate(tmp_path: Path, tiny_bert_dir: Path, reviews):
    recipe = write_recipe(
        tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=STAGES, extra=GATES
    )
    cli = CliRunner()
    result = cli.invoke(main, ["run", str(recipe), "--out", str(tmp_path / "runs")])
    assert result.exit_code == 1, result.output
    run = tmp_path / "runs" / "tiny"
    artifact = "02-export/arm64-onnx-fp32"
    size = (run / artifact / "model.onnx").stat().st_size
    assert f"gate failed: max_bytes {artifact}: value {size} vs threshold 1000" in result.output

    report = json.loads((run / "report.json").read_text())
    assert report["schema"] == SCHEMA and report["split"] == "test" and report["data"]["rows"] == 32
    assert report["teacher"]["role"] == "teacher" and report["teacher"]["format"] == "torch"
    [entry] = report["artifacts"]
    assert (entry["name"], entry["format"], entry["target"]) == (artifact, "onnx", "arm64-onnx")
    assert entry["metrics"]["agreement"] > 0.9  # an fp32 export predicts what its source predicts
    assert entry["measured"]["runtime"].startswith("onnxruntime")
    verdicts = {(g["gate"], g["verdict"]) for g in report["gates"]}
    budgets = {("target.max_bytes", "pass"), ("target.max_latency_p50_ms", "pass")}  # arm64-onnx profile
    assert verdicts == {("max_bytes", "fail"), ("min_agreement", "pass"), *budgets}
    assert artifact in (run / "report.md").read_text()
    assert (run / "report.png").read_bytes()[:4] == b"\x89PNG"

    junit = tmp_path / "gates.xml"
    result = cli.invoke(
        main,
        ["gate", str(run / "report.json"), "--baseline", str(run / "report.json"), "--junit", str(junit)],
    )
    assert result.exit_code == 1
    failures = [
        c.get("classname")
        for c in ET.parse(junit).getroot().iter("testcase")
        if c.find("failure") is not None
    ]
    assert failures == ["compress.gate.max_bytes"]  # against itself, no regression gate fails

    (run / "report.md").unlink()
    result = cli.invoke(main, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert "1 artifacts, 4 gates, 1 failed" in result.output
    assert (run / "report.md").is_file()
