"""Report: metrics from logits, device-result merging, and the three files written from report.json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from compress.errors import CompressError
from compress.gate import verdicts_of
from compress.metrics import fidelity_metrics, latency_summary, paired_accuracy_interval, task_metrics
from compress.report import SCHEMA, load_report, merge_device_results, regenerate
from compress.report_render import markdown

LABELS = ["negative", "positive"]


def test_task_metrics_count_each_class_and_score_the_positive_class():
    logits = np.array([[2, 0], [0, 2], [0, 2], [2, 0], [0, 2]], dtype=np.float32)  # predicts 0 1 1 0 1
    labels = [0, 1, 0, 1, 1]
    m = task_metrics(logits, labels, LABELS)
    assert m["accuracy"] == pytest.approx(3 / 5)
    assert m["per_class"] == {
        "negative": {"support": 2, "predicted": 2, "correct": 1},
        "positive": {"support": 3, "predicted": 3, "correct": 2},
    }
    assert m["f1"] == pytest.approx(2 / 3)  # positive: tp 2, fp 1, fn 1
    assert m["macro_f1"] == pytest.approx((0.5 + 2 / 3) / 2)


def test_a_student_that_predicts_one_class_shows_in_f1_not_only_accuracy():
    logits = np.tile([3.0, 0.0], (10, 1))
    m = task_metrics(logits, [0] * 8 + [1] * 2, LABELS)
    assert m["accuracy"] == pytest.approx(0.8)
    assert m["f1"] == 0.0
    assert m["per_class"]["positive"]["predicted"] == 0


def test_fidelity_metrics_against_the_teacher():
    teacher = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    same = fidelity_metrics(teacher.copy(), teacher)
    assert same == {"agreement": 1.0, "mean_kl": pytest.approx(0.0, abs=1e-12), "max_abs_logit_diff": 0.0}
    student = np.array([[1.0, 0.0], [1.0, 0.0], [2.0, 0.5]])
    diff = fidelity_metrics(student, teacher)
    assert diff["agreement"] == pytest.approx(2 / 3)
    assert diff["max_abs_logit_diff"] == pytest.approx(1.0)
    p = np.exp(teacher) / np.exp(teacher).sum(1, keepdims=True)
    q = np.exp(student) / np.exp(student).sum(1, keepdims=True)
    assert diff["mean_kl"] == pytest.approx(float((p * np.log(p / q)).sum(1).mean()))


def test_latency_summary_is_in_milliseconds():
    s = latency_summary([0.001 * i for i in range(1, 101)])
    assert s["p50"] == pytest.approx(50.5)
    assert s["p99"] == pytest.approx(99.01)
    assert s["samples"] == 100


def _entry(name: str, role: str, fmt: str, acc: float, p50: float, size: int, sha: str) -> dict:
    metrics = {
        "accuracy": acc,
        "macro_f1": acc,
        "f1": acc,
        "per_class": {
            "negative": {"support": 5, "predicted": 5, "correct": 4},
            "positive": {"support": 5, "predicted": 5, "correct": 4},
        },
        "latency_ms": {"p50": p50, "p90": p50 * 1.2, "p99": p50 * 1.5, "warmup": 10},
        "throughput": {"batch_size": 32, "items_per_s": 1000 / p50},
        "peak_rss_bytes": 300_000_000,
    }
    if role != "teacher":
        metrics.update(agreement=0.97, mean_kl=0.01, max_abs_logit_diff=0.4)
    return {
        "name": name,
        "role": role,
        "format": fmt,
        "target": None,
        "precision": "fp32",
        "bytes": size,
        "sha256": sha,
        "parameters": size // 4,
        "metrics": metrics,
        "measured": {"where": "host", "machine": "x86_64", "runtime": "x", "threads": 2},
    }


def _report() -> dict:
    return {
        "schema": SCHEMA,
        "recipe": "tiny",
        "split": "test",
        "data": {"source": "test.tsv", "sha256": "ab" * 32, "rows": 10, "labels": LABELS, "pairs": False},
        "host": {"machine": "x86_64", "cpus": 2},
        "teacher": _entry("teacher", "teacher", "torch", 0.9, 40.0, 90_000_000, "t" * 64),
        "checkpoints": [_entry("02-distill", "checkpoint", "torch", 0.88, 20.0, 40_000_000, "d" * 64)],
        "artifacts": [_entry("03-export/pi4-int8", "artifact", "tflite", 0.87, 8.0, 10_000_000, "a" * 64)],
        "device_results": [],
        "gates_config": {"max_bytes": 5_000_000},
    }


def _device_result(sha: str = "a" * 64, p50: float = 31.0) -> dict:
    return {
        "schema": "compress.device-benchmark/1",
        "artifact": "03-export/pi4-int8",
        "model_sha256": sha,
        "interpreter": {"name": "ai_edge_litert", "version": "2.3.0"},
        "threads": 4,
        "latency_ms": {"p50": p50, "p90": p50 + 2, "p99": p50 + 5},
        "device": {"machine": "aarch64", "cpu_model": "Cortex-A72", "board": "Raspberry Pi 4 Model B"},
    }


def test_markdown_compares_every_model_with_the_teacher():
    text = markdown({**_report(), "gates": [], "passed": True})
    for name in ("`teacher`", "`02-distill`", "`03-export/pi4-int8`"):
        assert name in text
    assert "-0.0300" in text  # accuracy delta of the artifact
    assert "5.00×" in text  # 40 ms -> 8 ms
    assert "9.00×" in text  # 90 MB -> 10 MB


def test_device_results_merge_by_model_hash_and_replace_the_same_device(tmp_path: Path):
    report = _report()
    first = tmp_path / "pi.json"
    first.write_text(json.dumps(_device_result(p50=31.0)))
    merge_device_results(report, first)
    first.write_text(json.dumps([_device_result(p50=29.0)]))
    merge_device_results(report, first)
    rows = report["device_results"]
    assert len(rows) == 1
    assert rows[0]["artifact"] == "03-export/pi4-int8" and rows[0]["where"] == "device"
    assert rows[0]["latency_ms"]["p50"] == 29.0


def test_device_results_from_the_fallback_model_merge_and_name_it(tmp_path: Path):
    from compress.io import write_json_atomic

    folder = tmp_path / "pi4-int8"
    folder.mkdir()
    fallback = "fallback-weight-only.tflite"
    write_json_atomic(
        folder / "manifest.json",
        {
            "schema": "compress.artifact/1", "kind": "artifact", "format": "tflite", "max_length": 16,
            "files": [{"path": "model.tflite", "sha256": "a" * 64}, {"path": fallback, "sha256": "b" * 64}],
            "fallbacks": [{"path": fallback, "interpreter": "tflite_runtime", "below": "2.15",
                           "scheme": "weight-only", "reason": "2.14 computes dynamic int8 wrongly"}],
        },
    )  # fmt: skip
    report = _report()
    report["artifacts"][0]["path"] = str(folder)
    path = tmp_path / "pi.json"
    path.write_text(json.dumps(_device_result(sha="b" * 64)))
    merge_device_results(report, path)
    row = report["device_results"][0]
    assert row["artifact"] == "03-export/pi4-int8" and row["model"] == fallback
    from compress.report_render import device_table

    assert f"`03-export/pi4-int8` ({fallback}) |" in "\n".join(device_table(report))
    path.write_text(json.dumps(_device_result(sha="a" * 64)))
    merge_device_results(report, path)
    assert report["device_results"][-1]["model"] == "model.tflite"
    assert "`03-export/pi4-int8` |" in "\n".join(device_table(report))  # the primary's row names no file


def test_device_results_for_a_model_not_in_the_run_are_refused(tmp_path: Path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps(_device_result(sha="f" * 64)))
    with pytest.raises(CompressError, match="matches no artifact"):
        merge_device_results(_report(), path)
    path.write_text(json.dumps({"latency": 3}))
    with pytest.raises(CompressError, match="device-benchmark/1"):
        merge_device_results(_report(), path)


def test_regenerate_writes_json_markdown_and_plot_and_rejudges_gates(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps(_report()))
    device = tmp_path / "pi.json"
    device.write_text(json.dumps(_device_result()))
    report = regenerate(run, device)
    assert report["passed"] is False
    assert [v.line() for v in verdicts_of(report) if v.failed] == [
        "max_bytes 03-export/pi4-int8: value 10000000 vs threshold 5000000"
    ]
    saved = load_report(run / "report.json")
    assert saved["device_results"][0]["cpu"] == "Cortex-A72"
    text = (run / "report.md").read_text()
    assert "Measured on device" in text and "Raspberry Pi 4 Model B" in text and "FAIL" in text
    assert (run / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_report_of_another_schema_is_refused(tmp_path: Path):
    (tmp_path / "report.json").write_text(json.dumps({"schema": "compress.report/0"}))
    with pytest.raises(CompressError, match=r"compress\.report/1"):
        load_report(tmp_path)


GOLD = [0, 1, 0, 1, 1, 0, 1, 0, 1, 1]
TEACHER_SAYS = [0, 1, 0, 1, 1, 0, 1, 0, 0, 0]  # right on 8 of 10
STUDENT_SAYS = [0, 1, 0, 1, 1, 0, 0, 0, 0, 0]  # right on 7 of 10: the teacher's rows but one


def _with_predictions() -> dict:
    report = _report()
    report["data"]["gold"] = list(GOLD)
    report["teacher"]["predictions"] = list(TEACHER_SAYS)
    for entry in report["checkpoints"] + report["artifacts"]:
        entry["predictions"] = list(STUDENT_SAYS)
        entry["metrics"]["accuracy_vs_teacher"] = paired_accuracy_interval(STUDENT_SAYS, TEACHER_SAYS, GOLD)
    return report


def test_evaluation_keeps_each_rows_prediction_and_the_interval_against_the_teacher(monkeypatch, tmp_path):
    # the module, not ``compress.evaluate`` the API function (what ``from compress import evaluate``
    # gives until something has imported the module)
    import compress.evaluate as evaluate
    from compress.data import Split
    from compress.subjects import Subject

    said = {"teacher": TEACHER_SAYS, "student": STUDENT_SAYS}

    def worker(subject, split, settings, threads):
        logits = np.eye(2, dtype=np.float32)[said[subject.name]]
        run = {
            "latency_ms": {"p50": 1.0},
            "throughput": {"items_per_s": 1.0},
            "peak_rss_bytes": 1,
            "rss_before_load_bytes": 1,
            "machine": "x86_64",
            "system": "Linux",
            "runtime": "fake",
            "threads": threads,
            "scored_batch_size": 1,
            "parameters": 3,
        }
        return logits, run

    monkeypatch.setattr(evaluate, "run_worker", worker)
    subjects = [
        Subject(name, tmp_path, "torch", role, LABELS)
        for name, role in (("teacher", "teacher"), ("student", "checkpoint"))
    ]
    split = Split([f"row {i}" for i in range(10)], None, GOLD, LABELS, "d.tsv", "ab" * 32)
    out = evaluate.evaluate_subjects(subjects, split, evaluate.Settings(bootstrap_resamples=500))
    assert out["data"]["gold"] == GOLD
    assert out["teacher"]["predictions"] == TEACHER_SAYS
    assert "accuracy_vs_teacher" not in out["teacher"]["metrics"]
    student = out["checkpoints"][0]
    assert student["predictions"] == STUDENT_SAYS
    assert student["metrics"]["accuracy_vs_teacher"] == paired_accuracy_interval(
        STUDENT_SAYS, TEACHER_SAYS, GOLD, resamples=500
    )
    assert student["metrics"]["accuracy_vs_teacher"]["diff_points"]["estimate"] == pytest.approx(-10.0)


def test_predictions_round_trip_and_the_report_shows_each_interval(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps(_with_predictions()))
    regenerate(run)
    saved = load_report(run / "report.json", shown=True)
    assert saved["data"]["gold"] == GOLD and saved["teacher"]["predictions"] == TEACHER_SAYS
    assert saved["artifacts"][0]["predictions"] == STUDENT_SAYS
    kept = saved["artifacts"][0]["metrics"]["accuracy_vs_teacher"]
    text = (run / "report.md").read_text()
    line = next(row for row in text.splitlines() if row.startswith("| `03-export/pi4-int8`"))
    diff, ratio = kept["diff_points"], kept["ratio"]
    assert f"[{diff['low']:+.2f}, {diff['high']:+.2f}]" in line
    assert f"{100 * ratio['estimate']:.1f}% [{100 * ratio['low']:.1f}, {100 * ratio['high']:.1f}]" in line
    assert "paired bootstrap" in text and "no interval" not in text


@pytest.mark.parametrize(
    ("damage", "key", "problem"),
    [
        (
            lambda r: r["artifacts"][0]["predictions"].pop(),
            "artifacts[0].predictions",
            "9 label ids for 10 rows",
        ),
        (lambda r: r["teacher"]["predictions"].append(1), "teacher.predictions", "11 label ids for 10 rows"),
        (lambda r: r["data"]["gold"].pop(), "data.gold", "9 label ids for 10 rows"),
        (
            lambda r: r["artifacts"][0]["predictions"].__setitem__(2, 1.5),
            "artifacts[0].predictions[2]",
            "integer",
        ),
        (
            lambda r: r["artifacts"][0]["predictions"].__setitem__(2, "1"),
            "artifacts[0].predictions[2]",
            "integer",
        ),
        (
            lambda r: r["checkpoints"][0]["predictions"].__setitem__(4, True),
            "checkpoints[0].predictions[4]",
            "integer",
        ),
        (
            lambda r: r["checkpoints"][0]["predictions"].__setitem__(3, -1),
            "checkpoints[0].predictions[3]",
            "0",
        ),
        (
            lambda r: r["artifacts"][0]["predictions"].__setitem__(5, 2),
            "artifacts[0].predictions[5]",
            "out of range",
        ),
        (lambda r: r["data"]["gold"].__setitem__(0, 7), "data.gold[0]", "out of range for the 2 labels"),
        (lambda r: r["artifacts"][0].__setitem__("predictions", "0101"), "artifacts[0].predictions", "list"),
        (lambda r: r["data"].pop("rows"), "data.rows", "row count"),
    ],
)
def test_a_wrong_predictions_list_is_one_line_naming_the_file_and_key(tmp_path: Path, damage, key, problem):
    report = _with_predictions()
    damage(report)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    with pytest.raises(CompressError) as caught:
        load_report(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: {key}: ")
    assert problem in message and "compress report RUN" in message


def test_an_old_report_without_predictions_still_loads_and_says_it_has_no_interval(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps(_report()))  # written before predictions were kept
    report = regenerate(run)
    assert "predictions" not in report["artifacts"][0]
    text = (run / "report.md").read_text()
    line = next(row for row in text.splitlines() if row.startswith("| `03-export/pi4-int8`"))
    assert line.count("no interval") == 2
    assert "No interval: this report keeps no per-row predictions" in text


def test_eval_input_errors_exit_2_with_one_line(tmp_path: Path):
    import click
    from click.testing import CliRunner

    from compress.cli import Group
    from compress.cli_report import COMMANDS

    @click.group(cls=Group)
    def cli() -> None:
        pass

    for command in COMMANDS:
        cli.add_command(command)
    data = tmp_path / "d.tsv"
    data.write_text("sentence\tlabel\nfine film\t1\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(cli, ["eval", str(empty), "--data", str(data)])
    assert result.exit_code == 2 and "not an artifact folder" in result.output
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"id2label": {"0": "negative", "1": "positive"}}))
    result = CliRunner().invoke(cli, ["eval", str(checkpoint), "--data", str(data)])
    assert result.exit_code == 2 and "missing column 'text'" in result.output
