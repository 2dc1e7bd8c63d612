"""A TFLite artifact's fallback model (the Pi's weight-only model for tflite-runtime 2.14) is measured on the
host beside its primary, recorded in its report entry, read back through the report schema and shown."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import compress.evaluate as evaluate
from compress.data import Split
from compress.errors import CompressError
from compress.io import file_entries, read_json, sha256_file, write_json_atomic
from compress.report import load_report, regenerate
from compress.subjects import Subject, subject_at
from tests.helpers.artifacts import cached_artifact
from tests.helpers.fallbacks import FALLBACK, with_fallback

TEXTS = ["the phone was really good", "awful service and rude staff", "a bland meal", "great value", "broke"]
GOLD = [1, 0, 0, 1, 0]


@pytest.fixture(scope="module")
def pi_artifact(tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TFLite artifact whose fallback is a different model file (one signature instead of two), so
    the sha256 in the report says which of the two the worker ran."""
    scratch = tmp_path_factory.mktemp("fallback-artifacts")
    primary = cached_artifact(tiny_bert_dir, scratch, "tflite", [16, 32])
    other = cached_artifact(tiny_bert_dir, scratch, "tflite", [32])
    folder = with_fallback(primary, scratch / "pi-int8")
    shutil.copyfile(other / "model.tflite", folder / FALLBACK)
    manifest = read_json(folder / "manifest.json")
    manifest.update(
        name="03-quantize/pi-int8", target="raspberry-pi-4", precision="int8", files=file_entries(folder)
    )
    write_json_atomic(folder / "manifest.json", manifest)
    return folder


def _evaluate(tiny_bert_dir: Path, artifact: Path) -> dict:
    labels = ["l0", "l1"]
    subjects = [Subject("teacher", tiny_bert_dir, "torch", "teacher", labels), subject_at(artifact)]
    split = Split(TEXTS, None, GOLD, labels, "d.tsv", "ab" * 32)
    settings = evaluate.Settings(latency_samples=3, warmup=1, batch_size=2, bootstrap_resamples=50)
    return evaluate.evaluate_subjects(subjects, split, settings)


def test_the_fallback_model_is_measured_beside_the_primary_and_shown(tiny_bert_dir, pi_artifact, tmp_path):
    report = _evaluate(tiny_bert_dir, pi_artifact)
    (entry,) = report["artifacts"]
    (fallback,) = entry["fallbacks"]
    assert fallback["path"] == FALLBACK and fallback["interpreter"] == "tflite_runtime"
    assert (fallback["below"], fallback["scheme"]) == ("2.15", "weight-only")
    # the worker ran the file asked for, not the primary the host's interpreter would pick
    assert fallback["sha256"] == sha256_file(pi_artifact / FALLBACK) != entry["sha256"]
    assert fallback["bytes"] == (pi_artifact / FALLBACK).stat().st_size
    assert len(fallback["predictions"]) == len(TEXTS)
    assert fallback["metrics"]["accuracy"] is not None and fallback["metrics"]["agreement"] is not None
    assert fallback["metrics"]["latency_ms"]["samples"] == 3

    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps({"schema": "compress.report/1", **report}))
    regenerate(run)
    assert load_report(run / "report.json", shown=True)["artifacts"][0]["fallbacks"][0]["path"] == FALLBACK
    text = (run / "report.md").read_text()
    assert "## Fallback models" in text
    row = next(line for line in text.splitlines() if line.startswith(f"| `03-quantize/pi-int8` ({FALLBACK})"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:3] == ["tflite_runtime < 2.15", "weight-only"]
    # the same model in both files (two signatures against one): every label the same as the primary's
    assert cells[5] == "1.0000"


def test_an_artifact_without_fallbacks_has_no_fallback_section(tiny_bert_dir, tmp_path):
    artifact = Path(
        shutil.copytree(cached_artifact(tiny_bert_dir, tmp_path, "tflite", [16, 32]), tmp_path / "a")
    )
    manifest = read_json(artifact / "manifest.json")
    write_json_atomic(artifact / "manifest.json", {**manifest, "target": "raspberry-pi-4"})
    report = _evaluate(tiny_bert_dir, artifact)
    assert "fallbacks" not in report["artifacts"][0]
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps({"schema": "compress.report/1", **report}))
    regenerate(run)
    assert "Fallback models" not in (run / "report.md").read_text()


def test_a_damaged_fallback_row_in_report_json_is_one_line(tiny_bert_dir, pi_artifact, tmp_path):
    report = _evaluate(tiny_bert_dir, pi_artifact)
    report["artifacts"][0]["fallbacks"][0]["bytes"] = "many"
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps({"schema": "compress.report/1", **report}))
    with pytest.raises(CompressError, match=r"artifacts\[0\]\.fallbacks\[0\]\.bytes") as info:
        load_report(run / "report.json")
    assert "\n" not in str(info.value)


def test_a_fallback_the_manifest_does_not_list_is_refused_before_anything_runs(pi_artifact, tmp_path):
    folder = Path(shutil.copytree(pi_artifact, tmp_path / "pi"))
    manifest = read_json(folder / "manifest.json")
    manifest["files"] = [f for f in manifest["files"] if f["path"] != FALLBACK]
    write_json_atomic(folder / "manifest.json", manifest)
    with pytest.raises(CompressError, match=rf"fallback model '{FALLBACK}' is not listed in files") as info:
        subject_at(folder)
    assert "\n" not in str(info.value)


def test_an_onnx_artifact_with_fallbacks_is_refused(tiny_bert_dir, tmp_path):
    onnx = with_fallback(cached_artifact(tiny_bert_dir, tmp_path, "onnx", [32]), tmp_path / "o", "model.onnx")
    with pytest.raises(CompressError, match=r"'fallbacks' are TFLite models, this is onnx"):
        subject_at(onnx)


def test_the_table_counts_the_rows_where_the_fallback_gives_another_label():
    from compress.report_render import fallback_table

    metrics = {"accuracy": 0.8, "agreement": 0.6, "latency_ms": {"p50": 4.0}}
    report = {
        "artifacts": [
            {
                "name": "04-quantize/pi-int8",
                "metrics": {"latency_ms": {"p50": 2.0}},
                "predictions": [0, 1, 1, 0, 1],
                "fallbacks": [
                    {
                        "path": FALLBACK,
                        "interpreter": "tflite_runtime",
                        "below": "2.15",
                        "scheme": "weight-only",
                        "bytes": 2_500_000,
                        "metrics": metrics,
                        "predictions": [0, 1, 0, 0, 1],
                    }
                ],
            }
        ]
    }
    (row,) = fallback_table(report)[2:]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == [
        f"`04-quantize/pi-int8` ({FALLBACK})",
        "tflite_runtime < 2.15",
        "weight-only",
        "0.8000",
        "0.6000",
        "0.8000",
        "4.00",
        "2.00",
        "2.00×",
        "2.50",
    ]
