"""Model cards in artifact folders: written with the report, filled from it, and never a changed hash."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from compress.io import file_entries, read_json, write_json_atomic
from compress.model_card import check_lines, write_artifact_cards
from compress.report import SCHEMA, regenerate
from compress.run_layout import CARD_FILE
from compress.runtime.runner import load
from tests.helpers.artifacts import cached_artifact


@pytest.fixture(scope="module")
def onnx_artifact(tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_artifact(tiny_bert_dir, tmp_path_factory.mktemp("artifacts"), "onnx", [32])


def entry(name: str, role: str, fmt: str, path: Path | None, sha: str, acc: float, p50: float, size: int):
    per_class = {"negative": {"support": 4, "predicted": 4, "correct": 3}}
    return {
        "name": name,
        "role": role,
        "path": str(path) if path else None,
        "format": fmt,
        "precision": "fp32",
        "bytes": size,
        "sha256": sha,
        "metrics": {
            "accuracy": acc,
            "f1": acc,
            "macro_f1": acc,
            "agreement": 0.9375,
            "per_class": per_class,
            "latency_ms": {"p50": p50, "p90": p50, "p99": p50},
        },
        "measured": {"where": "host", "machine": "x86_64", "runtime": "x", "threads": 2},
    }


def run_with_report(root: Path, artifact: Path, teacher: Path) -> tuple[Path, Path]:
    folder = Path(shutil.copytree(artifact, root / "02-export" / "tiny-board-fp32"))
    sha = next(f["sha256"] for f in read_json(folder / "manifest.json")["files"] if f["path"] == "model.onnx")
    report = {
        "schema": SCHEMA,
        "recipe": "tiny",
        "split": "test",
        "data": {"source": "/data/reviews.tsv", "rows": 16, "labels": ["l0", "l1"]},
        "host": {"machine": "x86_64", "cpus": 2},
        "teacher": entry("teacher", "teacher", "torch", teacher, "t" * 64, 0.875, 4.5, 9_000_000),
        "checkpoints": [],
        "artifacts": [entry("02-export/onnx-32", "artifact", "onnx", folder, sha, 0.8125, 1.25, 2_500_000)],
        "device_results": [],
    }
    write_json_atomic(root / "report.json", report)
    return root, folder


def card(folder: Path) -> tuple[dict, str]:
    text = (folder / CARD_FILE).read_text()
    assert text.startswith("---\n")
    header, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(header), body


def test_the_report_writes_a_card_into_each_artifact_folder(onnx_artifact, tiny_bert_dir, tmp_path):
    run, folder = run_with_report(tmp_path / "run", onnx_artifact, tiny_bert_dir)
    manifest_before = (folder / "manifest.json").read_bytes()
    regenerate(run)
    meta, body = card(folder)
    assert meta["pipeline_tag"] == "text-classification" and meta["labels"] == ["l0", "l1"]
    # a local teacher is named in the text; base_model is for a Hub id only
    assert "base_model" not in meta and meta["datasets"] == ["reviews.tsv"]
    assert f"made by compress from `{tiny_bert_dir.parent.name}/{tiny_bert_dir.name}`" in body
    results = meta["model-index"][0]["results"][0]["metrics"]
    assert {"type": "accuracy", "value": 0.8125} in results and {
        "type": "agreement",
        "value": 0.9375,
    } in results
    assert "| this model | 81.25 | 93.75 | 1.25 | 2.5 |" in body and "| 87.50 | 100.00 | 4.50 | 9.0 |" in body
    assert f"python -m compress.runtime.runner --dir {folder} predict" in body
    assert f"compress bundle {run} --target tiny-board" in body
    # the card is not one of the manifest's files: every recorded hash still holds
    assert (folder / "manifest.json").read_bytes() == manifest_before
    listed = {e["path"]: e["sha256"] for e in read_json(folder / "manifest.json")["files"]}
    assert CARD_FILE not in listed
    assert all(listed[e["path"]] == e["sha256"] for e in file_entries(folder) if e["path"] != CARD_FILE)
    assert load(folder, verify=True).predict(["good phone"])[0]["label"] in ("l0", "l1")


def test_a_card_quotes_no_numbers_measured_on_another_file(onnx_artifact, tiny_bert_dir, tmp_path):
    run, folder = run_with_report(tmp_path / "run", onnx_artifact, tiny_bert_dir)
    report = read_json(run / "report.json")
    report["artifacts"][0]["sha256"] = "0" * 64
    report["teacher"]["path"] = "someone/tiny-bert"
    assert write_artifact_cards(report) == [folder / CARD_FILE]
    meta, body = card(folder)
    assert "model-index" not in meta and "81.25" not in body and "No report of the run measured" in body
    assert meta["base_model"] == "someone/tiny-bert"


def test_the_card_says_what_the_manifest_check_measured():
    export = {"max_abs_diff": 9.5367431640625e-07, "atol": 0.001, "rtol": 0.001, "shapes": [[1, 32]]}
    assert check_lines(export) == [
        "At export, against the PyTorch model it was made from: largest logit difference 9.54e-07 "
        "(tolerance atol 0.001, rtol 0.001).",
        "",
    ]
    quantized = {"eval": {"agreement": 0.992, "samples": 250, "float_accuracy": 0.8, "accuracy": 0.796}}
    assert check_lines(quantized) == [
        "Quantized, against the fp32 artifact it came from on 250 eval rows: 99.20% of its labels kept; "
        "accuracy 80.00% -> 79.60%.",
        "",
    ]
    assert check_lines({}) == []


def test_a_missing_or_broken_artifact_folder_gets_no_card_and_the_report_is_still_written(
    onnx_artifact, tiny_bert_dir, tmp_path, caplog
):
    run, folder = run_with_report(tmp_path / "run", onnx_artifact, tiny_bert_dir)
    (folder / "labels.json").write_text('["l0", "l0"]')
    report = read_json(run / "report.json")
    gone = entry("02-export/gone", "artifact", "onnx", tmp_path / "nowhere", "a" * 64, 0.5, 1.0, 1)
    report["artifacts"].append(gone)
    write_json_atomic(run / "report.json", report)
    regenerate(run)
    assert not (folder / CARD_FILE).exists() and (run / "report.md").is_file()
    warning = next(r.getMessage() for r in caplog.records if "model card" in r.getMessage())
    assert "labels.json: a label name is listed twice" in warning


def test_a_folders_total_bytes_leave_out_the_model_card_written_after_it_was_measured(tmp_path):
    from compress.footprint import total_bytes

    (tmp_path / "model.onnx").write_bytes(b"x" * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "README.md").write_bytes(b"y" * 7)  # only the top-level card is left out
    before = total_bytes(tmp_path)
    (tmp_path / "README.md").write_text("---\nlicense: apache-2.0\n---\n# card\n", encoding="utf-8")
    assert before == 107 and total_bytes(tmp_path) == before


def test_a_hub_teacher_named_in_run_json_is_the_cards_base_model(onnx_artifact, tiny_bert_dir, tmp_path):
    """A hub teacher's folder is a cache snapshot path; the card takes the recipe's id from run.json."""
    from compress.pipeline import RUN_SCHEMA

    run, folder = run_with_report(tmp_path / "run", onnx_artifact, tiny_bert_dir)
    report = read_json(run / "report.json")
    report["run"] = str(run)
    for hub, expected in ((None, None), ("someone/tiny-bert", "someone/tiny-bert")):
        run_json = {"schema": RUN_SCHEMA, "recipe_file": "", "teacher_dir": str(tiny_bert_dir), "stages": []}
        write_json_atomic(run / "run.json", {**run_json, "teacher_hub": hub})
        write_artifact_cards(report)
        assert card(folder)[0].get("base_model") == expected
    write_json_atomic(run / "run.json", {**run_json, "teacher_hub": "../../etc"})
    write_artifact_cards(report)  # an id that is no Hub id fails run.json's check: no base_model, no crash
    assert "base_model" not in card(folder)[0]
