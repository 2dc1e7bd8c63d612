"""The benchmark suite's bookkeeping: recipes it runs stay valid, floors and verdicts are computed right."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from benchmarks import compress_rows, hardware, render, rerun, rows, seeds, suite
from compress.recipe import load_recipe
from tests.conftest import REPO


def test_macs_count_projections_feed_forward_attention_and_factorised_embedding():
    shape = hardware.EncoderShape(layers=2, hidden=8, intermediate=32, num_labels=2)
    macs = hardware.encoder_macs(shape, 10)
    assert macs["linear"] == 2 * 10 * (4 * 64 + 2 * 8 * 32) + 64 + 16
    assert macs["attention"] == 2 * 2 * 100 * 8
    factorised = hardware.encoder_macs(hardware.EncoderShape(2, 8, 32, 2, embedding_rank=4), 10)
    assert factorised["total"] - macs["total"] == 10 * 4 * 8


def test_encoder_shape_reads_sharing_from_config():
    config = {
        "num_hidden_layers": 3,
        "hidden_size": 384,
        "intermediate_size": 1536,
        "id2label": {"0": "a", "1": "b"},
        "compress_sharing": {"embedding_rank": 128},
    }
    assert hardware.encoder_shape(config) == hardware.EncoderShape(3, 384, 1536, 2, 128)


def test_fixed_shape_models_compute_on_the_smallest_signature_that_fits():
    assert hardware.padded_lengths([5, 64, 65, 300], [128, 64]).tolist() == [64, 64, 128, 128]


def test_holdout_split_keeps_every_row_once_and_the_header(tmp_path: Path):
    lines = ["sentence\tlabel\n"] + [f'a "quoted" row {i}\t{i % 2}\n' for i in range(50)]
    train = tmp_path / "train.tsv"
    train.write_text("".join(lines))
    fit, held = compress_rows.holdout_split(train, tmp_path / "split", 0.1, 3, seed=0)
    fit_rows, held_rows = fit.read_text().splitlines(True), held.read_text().splitlines(True)
    assert fit_rows[0] == held_rows[0] == lines[0]
    assert len(held_rows) == 1 + 3
    assert sorted(fit_rows[1:] + held_rows[1:]) == sorted(lines[1:])
    again = compress_rows.holdout_split(train, tmp_path / "again", 0.1, 3, seed=0)[1]
    assert again.read_text() == held.read_text()


@pytest.mark.parametrize("recipe", ["distil3.yaml", "distil2.yaml", "int8-variants.yaml"])
@pytest.mark.parametrize("task", ["sst2", "mrpc"])
def test_benchmark_recipes_load_with_the_suite_overrides(tmp_path: Path, tiny_bert_dir: Path, recipe, task):
    """Column names like ``#1 String`` survive the --set round trip, and the stages still validate."""
    data = tmp_path / task
    data.mkdir()
    text, pair, label = suite.COLUMNS[task]
    header = "\t".join(c for c in (label, text, pair) if c) + "\n"
    for name in ("train.tsv", "dev.tsv", "heldout.tsv"):
        (data / name).write_text(header + "\t".join(["1", "good", "fine"][: 2 + bool(pair)]) + "\n")
    t = suite.Task(task, data, tiny_bert_dir, text, pair, label)
    args = argparse.Namespace(
        warmup=3,
        threads=2,
        batch_size=32,
        latency_samples=None,
        limit=5,
        train_limit=None,
        epochs=1,
        recovery_epochs=2,
        # plain overrides go to every task, TASK:KEY=VALUE to that task only
        overrides=["mrpc:seed=7", "sst2:seed=5", "evaluate.warmup=4"],
    )
    path = REPO / "benchmarks" / "recipes" / recipe
    sets = suite.recipe_overrides(t, path, data / "train.tsv", data / "heldout.tsv", ["l0", "l1"], args)
    loaded = load_recipe(path, sets)
    assert (loaded.task.text, loaded.task.text_pair, loaded.task.label) == (text, pair, label)
    assert loaded.name == f"{task}-{path.stem}" and loaded.data.test.limit == 5
    assert (loaded.seed, loaded.evaluate.warmup) == ({"mrpc": 7, "sst2": 5}[task], 4)
    types = [s.type for s in loaded.stages]
    if recipe == "distil3.yaml":  # both tasks' students: four layers with narrower blocks
        assert (loaded.stages[0].layers, loaded.stages[1].ffn) == (4, 576)
    assert [s.epochs for s in loaded.stages if s.type == "distill"] == ([1] if "distill" in types else [])
    assert [s.recovery.epochs for s in loaded.stages if s.type == "share"] == (
        [2] if "share" in types else []
    )


def test_a_recipe_sets_options_for_one_task_in_tasks_beside_it(tmp_path: Path):
    recipe = tmp_path / "r.yaml"
    assert suite.recipe_task_overrides(recipe, "mrpc") == []  # no tasks/r.yaml: nothing
    (tmp_path / "tasks").mkdir()
    sidecar = tmp_path / "tasks" / "r.yaml"
    sidecar.write_text("mrpc: ['stages.0.augment={method: pairs}', seed=3]\n")
    assert suite.recipe_task_overrides(recipe, "mrpc") == ["stages.0.augment={method: pairs}", "seed=3"]
    assert suite.recipe_task_overrides(recipe, "sst2") == []
    for bad in ("qnli: [seed=1]\n", "mrpc: seed=1\n", "mrpc: [seed]\n", "mrpc: [1\n"):
        sidecar.write_text(bad)
        with pytest.raises(SystemExit, match=r"error: .*tasks/r.yaml: "):
            suite.recipe_task_overrides(recipe, "mrpc")


def _row(
    group: str, fmt: str, precision: str, accuracy: float, p50: float, recipe: str | None = None
) -> dict:
    return {
        "group": group,
        "format": fmt,
        "precision": precision,
        "accuracy": accuracy,
        "p50_ms": p50,
        "recipe": recipe,
        "row": f"{group} {fmt} {precision} {recipe}",
    }


def test_headline_must_be_faster_and_as_accurate_as_every_peer_and_keep_97_percent():
    table = [
        _row("teacher", "torch", "fp32", 0.90, 20.0),
        _row("peer", "onnx", "int8", 0.88, 5.0),
        _row("compress", "onnx", "int8", 0.89, 3.0, recipe="distil3"),
    ]
    verdict = rows.headline_verdict(table, "distil3", "onnx")
    assert verdict["keeps_97pct"] and verdict["ahead_of_all"]
    table[1]["p50_ms"] = 2.0
    verdict = rows.headline_verdict(table, "distil3", "onnx")
    assert not verdict["ahead_of_all"]
    assert [(a["peer"], a["faster"]) for a in verdict["against"]] == [(False, True), (True, False)]
    table[2]["accuracy"] = 0.85
    assert not rows.headline_verdict(table, "distil3", "onnx")["keeps_97pct"]
    assert rows.headline_verdict(table, "distil2", "onnx")["headline"] is None


def _full_row(task: str, group: str, fmt: str, precision: str, accuracy: float, p50: float, **extra) -> dict:
    label = {"teacher": "teacher", "peer": "teacher, ORT dynamic int8"}.get(
        group, "distil 6→3 + share + int8"
    )
    row = {
        **_row(group, fmt, precision, accuracy, p50, extra.pop("recipe", None)),
        "task": task,
        "label": label,
        "f1": accuracy - 0.01,
        "agreement": None if group == "teacher" else 0.95,
        "p90_ms": p50 * 1.2,
        "throughput_per_s": 100.0,
        "bytes": 5e6,
        "peak_rss_bytes": 1e8,
        "macs": {"total": 2e8},
        "floor_ms": 1.0,
        "x_floor": p50,
        "padded_to": None,
        "mean_tokens": 24.0,
        "entry": {"metrics": {"latency_ms": {"samples": 10}}},
        **extra,
    }
    row["row"] = f"{label} · {fmt} {precision}"
    return row


def test_results_are_written_as_json_markdown_and_plot(tmp_path: Path):
    table = [
        _full_row("mrpc", "teacher", "torch", "fp32", 0.86, 20.0),
        _full_row("mrpc", "peer", "onnx", "int8", 0.85, 6.0),
        _full_row(
            "mrpc",
            "compress",
            "tflite",
            "int8",
            0.84,
            3.0,
            recipe="distil3",
            padded_to=[64, 128],
            floor_padded_ms=2.0,
        ),
    ]
    results = {
        "quick": True,
        "created": "now",
        "command": "python -m benchmarks.suite --quick",
        "suite_wall_s": 60.0,
        "host": {"cpu": "test CPU", "machine": "x86_64", "threads": 2},
        "versions": {"torch": "x"},
        "gemm": {
            "size": 64,
            "threads": 2,
            "macs_per_s": {"fp32 torch.matmul": 1e9, "int8 torch._int_mm": 2e9},
            "peak_macs_per_s": {"fp32": 1e9, "int8": 2e9},
            "passes": [
                {"peak_macs_per_s": {"fp32": 1e9, "int8": 1.5e9}},
                {"peak_macs_per_s": {"fp32": 0.5e9, "int8": 2e9}},
            ],
        },
        "tasks": {"mrpc": {}},
        "rows": table,
        "recipes": [],
        "headline": {"mrpc": rows.headline_verdict(table, "distil3", "tflite")},
    }
    kinds = {"matmul": 50.0, "act. quant": 5.0, "attention": 10.0, "layer norm": 5.0}
    kinds |= {"GELU": 5.0, "lookup": 5.0, "other": 0.0}
    table[1]["op_profile"] = {
        "requests": 4,
        "run_us": 100.0,
        "kernel_us": 80.0,
        "outside_kernels": 0.2,
        "kinds_us": kinds,
        "ops": [{"op": "DynamicQuantizeMatMul", "kind": "matmul", "nodes": 12, "us": 40.0}],
    }
    render.write_all(results, tmp_path / "out")
    text = (tmp_path / "out" / "results.md").read_text()
    assert "Where the ONNX Runtime call goes" in text
    assert "| 100 | 20% | 50% | 5% | 10% | 5% | 5% | 5% | 0% | DynamicQuantizeMatMul ×12 (40%) |" in text
    assert "| F1 |" in text and "quick harness check" in text
    assert "not strictly ahead of every peer row" in text and "(2.00 padded)" in text
    assert "best of 2 passes (before and after the rows: 1 / 0 fp32; 2 / 2 int8)" in text
    assert (tmp_path / "out" / "plot.png").stat().st_size > 1000
    assert (tmp_path / "out" / "results.json").is_file()


def test_the_issues_targets_hold_each_formats_artifact_against_the_teachers_int8_row_of_that_format(
    tmp_path: Path,
):
    """Accuracy kept against the task's own target, bytes and p50 over the teacher's int8 row of the
    same format (ORT for ONNX, ai-edge-quantizer for TFLite), p50 over the padded floor for TFLite."""
    table = [
        _full_row("mrpc", "teacher", "torch", "fp32", 0.80, 20.0, name="teacher"),
        _full_row("mrpc", "peer", "onnx", "int8", 0.80, 6.0, name="teacher-onnx-int8-ort", bytes=20e6),
        _full_row("mrpc", "peer", "tflite", "int8", 0.80, 4.0, name="teacher-tflite-int8-aeq", bytes=24e6),
        _full_row("mrpc", "compress", "onnx", "int8", 0.788, 1.8, recipe="distil3", bytes=5e6, floor_ms=0.5),
        _full_row(
            "mrpc",
            "compress",
            "tflite",
            "int8",
            0.78,
            1.6,
            recipe="distil3",
            bytes=7e6,
            padded_to=[64],
            floor_ms=0.4,
            floor_padded_ms=0.8,
        ),
    ]
    onnx, tflite = rows.issue_targets(table, "mrpc", "distil3")
    assert (onnx["format"], onnx["baseline"]) == ("onnx", table[1]["row"])
    assert onnx["accuracy_share"] == pytest.approx(0.985) and onnx["accuracy_target"] == 0.98
    assert onnx["bytes_ratio"] == pytest.approx(0.25) and onnx["p50_ratio"] == pytest.approx(0.3)
    assert onnx["x_floor"] == pytest.approx(3.6) and onnx["x_floor_target"] == 2.5
    assert tflite["baseline"] == table[2]["row"] and tflite["x_floor"] == pytest.approx(2.0)
    assert rows.issue_targets(table, "cola", "distil3")[0]["accuracy_target"] is None
    assert rows.issue_targets(table[:1] + table[3:], "mrpc", "distil3") == []  # no baseline rows
    lines = render.targets_table([onnx, tflite])
    assert "| **98.5%: met** (≥ 98%) | **0.250: met** | **0.30: met** | 3.6×: missed (≤ 2.5×) |" in lines[2]
    assert "97.5%: missed (≥ 98%) | 0.292: missed | 0.40: missed | **2.0×: met** (≤ 3×) |" in lines[3]


GOLD = [i % 2 for i in range(40)]


def _says(right: int) -> list[int]:
    """Predictions right on the first ``right`` dev rows of GOLD and wrong on the rest."""
    return [g if i < right else 1 - g for i, g in enumerate(GOLD)]


def test_each_row_gets_a_paired_interval_against_the_teacher_pytorch_row_or_says_why_not(tmp_path: Path):
    table = [
        _full_row("sst2", "teacher", "torch", "fp32", 0.9, 20.0),
        _full_row("sst2", "teacher", "onnx", "fp32", 0.9, 10.0),
        _full_row("sst2", "peer", "onnx", "int8", 0.85, 6.0),
        _full_row("sst2", "compress", "onnx", "int8", 0.875, 3.0, recipe="distil3"),
        _full_row("sst2", "compress", "tflite", "int8", 0.8, 3.0, recipe="distil3"),
    ]
    for row, right in zip(table, [36, 36, 34, 35, None], strict=True):
        if right is not None:
            row["entry"]["predictions"] = _says(right)
    table[3]["row"] = "distil 6→3 + share + int8 · onnx int8"
    rows.add_intervals(table, GOLD, resamples=500)
    assert "accuracy_vs_teacher" not in table[0]  # the reference itself
    same = table[1]["accuracy_vs_teacher"]
    assert same["diff_points"] == {"estimate": 0.0, "low": 0.0, "high": 0.0}
    assert same["vs"] == table[0]["row"] and same["resamples"] == 500
    peer = table[2]["accuracy_vs_teacher"]
    assert peer["diff_points"]["estimate"] == pytest.approx(-5.0)  # 2 of 40 rows fewer
    assert peer["diff_points"]["low"] < -5.0 < peer["diff_points"]["high"] <= 0
    assert peer["ratio"]["estimate"] == pytest.approx(34 / 36)
    assert table[4]["accuracy_vs_teacher"] == {
        "missing": "no per-row predictions (measured before the suite kept them)"
    }
    verdict = rows.headline_verdict(table, "distil3", "onnx")
    assert verdict["accuracy_share_interval"] == table[3]["accuracy_vs_teacher"]["ratio"]
    results = {
        "quick": False,
        "created": "now",
        "command": "python benchmarks/suite.py",
        "suite_wall_s": 60.0,
        "host": {"cpu": "test CPU", "machine": "x86_64", "threads": 2},
        "versions": {"torch": "x"},
        "gemm": {
            "size": 64,
            "threads": 2,
            "macs_per_s": {"fp32": 1e9},
            "peak_macs_per_s": {"fp32": 1e9, "int8": 2e9},
        },
        "tasks": {"sst2": {"gold": GOLD}},
        "rows": table,
        "recipes": [],
        "headline": {"sst2": verdict},
    }
    render.write_all(results, tmp_path)
    text = (tmp_path / "results.md").read_text()
    peer_line = next(line for line in text.splitlines() if line.startswith(f"| {table[2]['row']} |"))
    low, high = peer["diff_points"]["low"], peer["diff_points"]["high"]
    assert f"| -5.00 [{low:+.2f}, {high:+.2f}] | 94.4 [" in peer_line
    assert "| ref | ref |" in next(line for line in text.splitlines() if line.startswith("| teacher · torch"))
    assert "no interval | no interval" in text and "No interval for some rows: no per-row predictions" in text
    assert "paired bootstrap percentile intervals over the 40 dev rows (500 resamples" in text
    share = verdict["accuracy_share_interval"]
    bounds = f"{100 * share['low']:.1f}–{100 * share['high']:.1f}%"
    assert f"(keeps the 97% bar; 95% CI {bounds}, its low end is below 97%)" in text
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["rows"][2]["accuracy_vs_teacher"] == peer


def test_without_the_teacher_pytorch_row_no_row_has_an_interval():
    table = [_full_row("sst2", "compress", "onnx", "int8", 0.8, 3.0, recipe="distil3")]
    table[0]["entry"]["predictions"] = _says(30)
    rows.add_intervals(table, GOLD)
    assert table[0]["accuracy_vs_teacher"] == {
        "missing": "no teacher PyTorch fp32 row in this run (e.g. --only compress)"
    }
    assert render.kept_cells(table[0]) == ["no interval", "no interval"]


def test_row_labels_say_what_was_done_and_each_quantize_stage_starts_from_the_checkpoint(tmp_path):
    from benchmarks.compress_rows import step_labels

    stages = [
        ("01-distill", {"type": "distill", "layers": 3}),
        ("02-share", {"type": "share"}),
        ("03-export", {"type": "export"}),
        ("04-quantize", {"type": "quantize", "scheme": "dynamic"}),
        ("05-quantize", {"type": "quantize", "scheme": "static"}),
    ]
    (tmp_path / "run.json").write_text(
        json.dumps({"stages": [{"dir": d, "type": c["type"]} for d, c in stages]})
    )
    for folder, config in stages:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "manifest.json").write_text(json.dumps({"config": config}))
    assert step_labels(tmp_path, 6) == {
        "01-distill": "distil 6→3",
        "02-share": "distil 6→3 + share",
        "03-export": "distil 6→3 + share",
        "04-quantize": "distil 6→3 + share + int8",
        "05-quantize": "distil 6→3 + share + int8 static",
    }
    (tmp_path / "run.json").write_text(json.dumps({"stages": [{"dir": "05-quantize", "type": "quantize"}]}))
    assert step_labels(tmp_path, 6) == {"05-quantize": "teacher + int8 static"}


def test_rows_of_several_targets_of_one_format_name_their_target_and_own_scheme(tmp_path):
    from benchmarks.compress_rows import RecipeRun, report_rows

    stages = [
        ("01-export", {"type": "export"}),
        ("02-quantize", {"type": "quantize", "scheme": {"phone": "dynamic", "pi": "weight-only"}}),
    ]
    (tmp_path / "run.json").write_text(
        json.dumps({"stages": [{"dir": d, "type": c["type"]} for d, c in stages]})
    )
    artifacts = []
    for folder, config in stages:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "manifest.json").write_text(json.dumps({"config": config}))
        for target, fmt in [("phone", "tflite"), ("pi", "tflite"), ("board", "onnx")]:
            if folder == "02-quantize" and target == "board":
                continue
            art = tmp_path / folder / target
            art.mkdir()
            manifest = {"target": target, "source": {"checkpoint": str(tmp_path / "teacher")}}
            (art / "manifest.json").write_text(json.dumps(manifest))
            artifacts.append({"name": f"{folder}/{target}", "path": str(art), "format": fmt})
    (tmp_path / "report.json").write_text(json.dumps({"checkpoints": [], "artifacts": artifacts}))
    run = RecipeRun("r", tmp_path, 0.0, 0, 0, [], 0.0)
    labels = {row["entry"]["name"]: row["label"] for row in report_rows(run, 6)}
    assert labels == {
        "01-export/phone": "teacher (phone)",
        "01-export/pi": "teacher (pi)",
        "01-export/board": "teacher",  # the only ONNX target needs no name
        "02-quantize/phone": "teacher + int8 (phone)",
        "02-quantize/pi": "teacher + int8 weight-only (pi)",
    }


def _seed_run(
    tmp_path: Path, seed: int | None, accuracy: float, with_teacher: bool, right: int | None = None
) -> Path:
    command = "python benchmarks/suite.py --only compress" + (
        f" --set seed={seed}" if seed is not None else ""
    )
    rows_ = [
        {
            "task": "sst2",
            "group": "compress",
            "row": "x · ONNX Runtime int8",
            "format": "onnx",
            "accuracy": accuracy,
            "bytes": 100,
            "p50_ms": 1.0,
        }
    ]
    if with_teacher:
        rows_.append(
            {
                "task": "sst2",
                "group": "teacher",
                "row": "teacher · PyTorch fp32",
                "format": "torch",
                "accuracy": 0.8,
                "bytes": 400,
                "p50_ms": 4.0,
            }
        )
    results = {"command": command, "rows": rows_}
    if right is not None:  # results that keep per-row predictions: the teacher is right on 36 of 40
        results["tasks"] = {"sst2": {"gold": GOLD}}
        for row in rows_:
            row["entry"] = {"predictions": _says(36 if row["group"] == "teacher" else right)}
    folder = tmp_path / f"run{seed}"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def test_seeds_aggregate_spread_and_share_of_the_teacher(tmp_path):
    runs = [
        seeds.load(_seed_run(tmp_path, None, 0.78, with_teacher=True)),
        seeds.load(_seed_run(tmp_path, 1, 0.80, with_teacher=False)),
        seeds.load(_seed_run(tmp_path, 2, 0.79, with_teacher=False)),
    ]
    summary = seeds.aggregate(runs)
    assert summary["seeds"] == [0, 1, 2]
    row = summary["tasks"]["sst2"]["rows"][0]
    assert row["accuracy"] == {"0": 0.78, "1": 0.80, "2": 0.79}
    assert row["accuracy_spread"]["mean"] == pytest.approx(0.79)
    assert row["accuracy_spread"]["std"] == pytest.approx(0.01)
    assert row["share_of_teacher"]["min"] == pytest.approx(0.975)
    assert "0.79" not in seeds.markdown(summary) and "79.00 ± 1.00" in seeds.markdown(summary)


def test_seeds_list_each_seeds_interval_and_pool_them_on_the_shared_rows(tmp_path):
    runs = [
        seeds.load(_seed_run(tmp_path, None, 0.85, with_teacher=True, right=34)),
        seeds.load(_seed_run(tmp_path, 1, 0.9, with_teacher=False, right=36)),
        seeds.load(_seed_run(tmp_path, 2, 0.8, with_teacher=False, right=32)),
    ]
    summary = seeds.aggregate(runs, resamples=400)
    kept = summary["tasks"]["sst2"]["rows"][0]["accuracy_vs_teacher"]
    assert kept["vs"] == "teacher · PyTorch fp32"
    estimates = {s: k["diff_points"]["estimate"] for s, k in kept["per_seed"].items()}
    assert estimates == pytest.approx({"0": -5.0, "1": 0.0, "2": -10.0})
    assert kept["per_seed"]["1"]["diff_points"] == {"estimate": 0.0, "low": 0.0, "high": 0.0}
    pooled = kept["pooled"]
    assert pooled["pooled"] == 3 and pooled["diff_points"]["estimate"] == pytest.approx(-5.0)
    assert pooled["diff_points"]["low"] < -5.0 < pooled["diff_points"]["high"]
    assert pooled["ratio"]["estimate"] == pytest.approx(34 / 36)
    text = seeds.markdown(summary)
    assert "seed 2: % of teacher [95% CI]" in text and "pooled: Δ points [95% CI]" in text
    assert "| 100.0 [100.0, 100.0] |" in text and f"| {100 * 34 / 36:.1f} [" in text
    assert "no interval" not in text.lower()
    # a seed measured on other dev rows has no interval, and then the pool has none either
    runs[2]["tasks"]["sst2"]["gold"] = [*GOLD[:-1], 1 - GOLD[-1]]
    kept = seeds.aggregate(runs, resamples=50)["tasks"]["sst2"]["rows"][0]["accuracy_vs_teacher"]
    assert kept["per_seed"]["2"] == {"missing": "measured on other dev rows than the teacher row"}
    assert kept["pooled"] == {"missing": "1 of 3 seeds have none, so no pooled one"}


def test_seeds_from_results_without_predictions_say_there_is_no_interval(tmp_path):
    runs = [
        seeds.load(_seed_run(tmp_path, None, 0.78, with_teacher=True)),
        seeds.load(_seed_run(tmp_path, 1, 0.80, with_teacher=False)),
    ]
    summary = seeds.aggregate(runs)
    assert summary["tasks"]["sst2"]["rows"][0]["accuracy_vs_teacher"]["pooled"] == {
        "missing": "2 of 2 seeds have none, so no pooled one"
    }
    text = seeds.markdown(summary)
    assert "No interval: no per-row predictions (measured before the suite kept them)." in text
    assert "[95% CI]" not in text  # no table of empty cells


def test_seeds_refuse_repeated_seeds_and_a_missing_teacher(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    twice = [seeds.load(_seed_run(tmp_path / d, 1, 0.8, with_teacher=True)) for d in ("a", "b")]
    with pytest.raises(SystemExit, match="two runs share seed 1 for sst2"):
        seeds.aggregate(twice)
    with pytest.raises(SystemExit, match="no run measured the sst2 teacher"):
        seeds.aggregate([seeds.load(_seed_run(tmp_path, 3, 0.8, with_teacher=False))])
    with pytest.raises(SystemExit, match=r"^error: .*missing: not found; check the path$"):
        seeds.load(tmp_path / "missing")


def test_seeds_take_the_teacher_from_a_run_of_another_recipe_without_counting_its_seed(tmp_path):
    (tmp_path / "other").mkdir()
    # a full run of another recipe: its teacher is the reference, its own seed-0 compress row is ignored
    other = seeds.load(_seed_run(tmp_path / "other", None, 0.70, with_teacher=True, right=30))
    other["rows"][0]["row"] = "y · ONNX Runtime int8"
    runs = [seeds.load(_seed_run(tmp_path, s, 0.80, with_teacher=False, right=34)) for s in (None, 1, 2)]
    with pytest.raises(SystemExit, match="no run measured the sst2 teacher"):
        seeds.aggregate(runs)
    summary = seeds.aggregate(runs, resamples=50, teacher_run=other)
    assert summary["seeds"] == [0, 1, 2] and summary["teacher"] == other["_file"]
    [row] = summary["tasks"]["sst2"]["rows"]
    assert row["row"] == "x · ONNX Runtime int8" and row["accuracy"] == {"0": 0.8, "1": 0.8, "2": 0.8}
    assert row["accuracy_vs_teacher"]["pooled"]["ratio"]["estimate"] == pytest.approx(34 / 36)
    assert f"Teacher rows from {other['_file']}." in seeds.markdown(summary)
    # the teacher's run is no seed, but two runs of one seed among the seeds are still refused
    with pytest.raises(SystemExit, match="two runs share seed 0 for sst2"):
        seeds.aggregate([*runs, seeds.load(_seed_run(tmp_path / "other", 0, 0.7, with_teacher=False))])


def test_results_carry_paths_relative_to_the_repository_and_shared():
    shared = Path(os.path.normpath(suite.REPO / ".." / "shared"))
    results = {
        "tasks": {"sst2": {"data": f"{shared}/data/sst2", "teacher": str(shared)}},
        "rows": [{"entry": {"path": f"{suite.REPO}/runs/b/sst2/peers/x"}, "bytes": 5}],
        "command": f"python benchmarks/suite.py --shared {shared} --out {suite.REPO}/benchmarks/results",
        "other": "/opt/elsewhere/file",
    }
    out = suite.portable(results, [shared, suite.REPO])
    assert out["tasks"]["sst2"] == {"data": "../shared/data/sst2", "teacher": "../shared"}
    assert out["rows"] == [{"entry": {"path": "runs/b/sst2/peers/x"}, "bytes": 5}]
    assert out["command"] == "python benchmarks/suite.py --shared ../shared --out benchmarks/results"
    assert out["other"] == "/opt/elsewhere/file"
    assert str(suite.REPO) not in json.dumps(out)


def test_fused_ort_peer_fuses_attention_and_computes_the_teacher(tmp_path, tiny_bert_dir):
    import numpy as np
    import onnx
    import onnxruntime as ort

    from benchmarks import peers
    from compress.export.onnx import export_onnx
    from compress.models import load_classifier
    from compress.targets import load_target

    model, tokenizer = load_classifier(tiny_bert_dir)
    export_onnx(model, tokenizer, tmp_path / "fp32", load_target("arm64-onnx"), name="fp32")
    built = peers.ort_fused_dynamic_int8(tiny_bert_dir, tmp_path / "fp32", tmp_path / "fused")
    manifest = json.loads((built.path / "manifest.json").read_text())
    assert manifest["precision"] == "int8" and manifest["quantization"]["fusions"]["Attention"] == 2
    ops = {n.op_type for n in onnx.load(str(built.path / "model.onnx")).graph.node}
    assert {"QAttention", "MatMulInteger"} <= ops
    # same inputs as the float artifact, right-padded rows included, and close to its logits
    rng = np.random.default_rng(1)
    feed = {i["name"]: np.zeros((3, 12), dtype=np.int64) for i in manifest["inputs"]}
    feed["input_ids"] = rng.integers(5, 90, (3, 12), dtype=np.int64)
    feed["attention_mask"] = (np.arange(12)[None, :] < np.array([[12], [7], [3]])).astype(np.int64)
    run = {
        name: ort.InferenceSession(str(tmp_path / name / "model.onnx")).run(None, feed)[0]
        for name in ("fp32", "fused")
    }
    assert np.abs(run["fused"] - run["fp32"]).max() < 0.05


def _task_rows(task: str, accuracy: float, with_teacher: bool) -> list[dict]:
    rows_ = [{"task": task, "group": "compress", "row": "x · ONNX Runtime int8", "format": "onnx"}]
    rows_[0] |= {"accuracy": accuracy, "bytes": 100, "p50_ms": 1.0}
    if with_teacher:
        rows_.append({"task": task, "group": "teacher", "row": "teacher · PyTorch fp32", "format": "torch"})
        rows_[1] |= {"accuracy": 0.8, "bytes": 400, "p50_ms": 4.0}
    return rows_


def test_a_seed_may_come_as_one_single_task_run_per_task(tmp_path):
    def run(name, seed, rows_):
        folder = tmp_path / name
        folder.mkdir()
        command = "python benchmarks/suite.py" + (f" --set seed={seed}" if seed else "")
        (folder / "results.json").write_text(json.dumps({"command": command, "rows": rows_}))
        return seeds.load(folder)

    sst2 = run("s0-sst2", 0, _task_rows("sst2", 0.76, True))
    mrpc = run("s0-mrpc", 0, _task_rows("mrpc", 0.72, True))
    both = run("s1", 1, _task_rows("sst2", 0.78, False) + _task_rows("mrpc", 0.74, False))

    summary = seeds.aggregate([sst2, mrpc, both])
    assert summary["seeds"] == [0, 1]
    assert summary["tasks"]["sst2"]["rows"][0]["accuracy"] == {"0": 0.76, "1": 0.78}
    assert summary["tasks"]["mrpc"]["rows"][0]["accuracy"] == {"0": 0.72, "1": 0.74}

    with pytest.raises(SystemExit, match="no run of seed 0 measured mrpc: pass its results folder too"):
        seeds.aggregate([sst2, both])


def test_seeds_say_where_each_run_was_measured_and_never_average_p50_over_machines(tmp_path):
    def run(name, seed, cpu, p50, with_teacher):
        folder = tmp_path / name
        folder.mkdir()
        rows_ = _task_rows("sst2", 0.78, with_teacher)
        rows_[0]["p50_ms"] = p50
        results = {
            "command": "python benchmarks/suite.py" + (f" --set seed={seed}" if seed else ""),
            "commit": {"sha": f"{seed}" * 40, "dirty": seed == 2},
            "host": {"cpu": cpu, "machine": "x86_64", "threads": 1},
            "created": f"2026-12-0{seed + 1}T10:00:00+00:00",
            "rows": rows_,
        }
        (folder / "results.json").write_text(json.dumps(results))
        return seeds.load(folder)

    xeon = [run("s0", 0, "Xeon", 1.0, True), run("s1", 1, "Xeon", 1.5, False)]
    one = seeds.aggregate(xeon)
    assert one["machines"] == ["Xeon"] and [m["commit"][:7] for m in one["runs"]] == ["0000000", "1111111"]
    text = seeds.markdown(one)
    assert "| 1.25 |" in text and "machines" not in text  # one machine: the mean p50 stands
    assert "| 2026-12-02T10:00:00+00:00 | Xeon, 1 thread | 1111111 |" in text

    mixed = seeds.aggregate([*xeon, run("s2", 2, "EPYC", 2.0, False)])
    assert mixed["machines"] == ["EPYC", "Xeon"]
    assert mixed["tasks"]["sst2"]["rows"][0]["p50_ms_per_seed"] == {"0": 1.0, "1": 1.5, "2": 2.0}
    text = seeds.markdown(mixed)
    assert "**Measured on 2 machines** (EPYC; Xeon)" in text and "| 1.00 / 1.50 / 2.00 |" in text
    assert "| 1.50 |" not in text  # no mean p50 cell over machines
    assert "2222222 (uncommitted changes)" in text

    # a teacher taken from another run is listed as such, not as a seed
    teacher = run("t", 3, "Xeon", 4.0, True)
    listed = seeds.aggregate(xeon, teacher_run=teacher)["runs"]
    assert [m["seed"] for m in listed] == [None, 0, 1]
    assert "| teacher rows only |" in seeds.markdown(seeds.aggregate(xeon, teacher_run=teacher))


def _rerun(tmp_path: Path, name: str, p50s: dict[str, float], commit: dict | None) -> Path:
    found = [
        {"task": "sst2", "row": row, "p50_ms": p50, "group": "peer", "format": "onnx"}
        for row, p50 in p50s.items()
    ]
    folder = tmp_path / name
    folder.mkdir()
    results = {"created": name, "commit": commit, "tasks": {"sst2": {}}, "rows": found}
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def test_a_rerun_agrees_only_on_one_clean_commit_with_every_ratio_within_the_tolerance(tmp_path):
    base, art = rerun.BASELINE, "distil · ONNX Runtime int8"
    clean = {"sha": "a" * 40, "dirty": False}
    first = seeds.load(_rerun(tmp_path, "a", {base: 2.0, art: 1.0, "float": 4.0}, clean))
    # the whole machine 20% slower: every ratio the same, so the runs agree
    slower = seeds.load(_rerun(tmp_path, "b", {base: 2.4, art: 1.2, "float": 4.8}, clean))
    summary = rerun.compare(first, slower)
    assert summary["agree"] and [r["within"] for r in summary["tasks"]["sst2"]["rows"]] == [True, True]
    assert "the runs agree" in rerun.markdown(summary)
    # one row 15% slower against the baseline: that row is outside 10%
    drift = seeds.load(_rerun(tmp_path, "c", {base: 2.0, art: 1.15, "float": 4.0}, clean))
    summary = rerun.compare(first, drift)
    (row,) = [r for r in summary["tasks"]["sst2"]["rows"] if not r["within"]]
    assert row["row"] == art and abs(row["change"] - 0.15) < 1e-9 and not summary["agree"]
    assert "largest change +15.0%: distil" in rerun.markdown(summary)
    # the same numbers from another commit, or with uncommitted changes, show no agreement
    for commit, says in (({"sha": "b" * 40, "dirty": False}, "different commits"), (None, "did not record")):
        other = seeds.load(_rerun(tmp_path, f"d{says[:3]}", {base: 2.0, art: 1.0, "float": 4.0}, commit))
        summary = rerun.compare(first, other)
        assert summary["every_ratio_within"] and not summary["agree"] and says in summary["commit_note"]
    dirty = seeds.load(_rerun(tmp_path, "e", {base: 2.0, art: 1.0}, {**clean, "dirty": True}))
    summary = rerun.compare(first, dirty)
    assert not summary["same_commit"] and summary["tasks"]["sst2"]["only_in_one_run"] == ["float"]
    rerun.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out")])
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"rerun.md", "rerun.json", "rerun.png"}


def test_a_rerun_needs_the_baseline_row_in_every_run(tmp_path):
    first = seeds.load(_rerun(tmp_path, "a", {rerun.BASELINE: 2.0, "x": 1.0}, None))
    other = seeds.load(_rerun(tmp_path, "b", {"x": 1.0}, None))
    with pytest.raises(SystemExit, match="pass --baseline"):
        rerun.compare(first, other)


def test_the_suite_records_the_commit_it_measured():
    commit = suite.source_commit()
    assert commit is not None and len(commit["sha"]) == 40 and isinstance(commit["dirty"], bool)
    assert render.commit_note(commit).startswith(f" at commit {commit['sha'][:7]}")
    assert render.commit_note(None) == ""


def test_vocab_unseen_aliases_each_dropped_row_to_its_nearest_kept_row(tiny_bert_dir):
    """benchmarks/vocab_unseen.py: a dropped token reads the kept row closest to its own by cosine;
    kept rows are untouched."""
    import torch

    from benchmarks.vocab_unseen import alias_rows, nearest_kept
    from compress.models import load_classifier

    table = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [-0.1, 2.0], [-1.0, 0.0]])
    assert nearest_kept(table, [0, 1]) == {2: 0, 3: 1, 4: 1}  # row 4 is as far from 0 as can be
    assert nearest_kept(table, [0, 1, 2, 3, 4]) == {}
    model, _ = load_classifier(tiny_bert_dir)
    weight = model.get_input_embeddings().weight
    before = weight.detach().clone()
    kept = list(range(0, weight.shape[0], 3))
    aliases = nearest_kept(before, kept)
    assert alias_rows(model, kept) == weight.shape[0] - len(kept) == len(aliases)
    assert torch.equal(weight[kept], before[kept])
    for dropped, row in aliases.items():
        assert row in kept and torch.equal(weight[dropped], before[row])


def test_the_gemm_peak_is_each_librarys_best_pass_and_the_floors_follow_it():
    from benchmarks.hardware import best_of
    from benchmarks.rows import refloor

    def gemm(fp32: float, int8: float) -> dict:
        rates = {"fp32 torch.matmul": fp32, "int8 torch._int_mm": int8 / 2, "int8 onnxruntime": int8}
        peaks = {"fp32": fp32, "int8": int8}
        return {"size": 64, "threads": 1, "macs_per_s": rates, "peak_macs_per_s": peaks}

    slow, fast = gemm(50e9, 400e9), gemm(40e9, 900e9)
    best = best_of([slow, fast])
    assert best["peak_macs_per_s"] == {"fp32": 50e9, "int8": 900e9}
    assert best["macs_per_s"]["int8 torch._int_mm"] == 450e9
    assert [p["peak_macs_per_s"]["int8"] for p in best["passes"]] == [400e9, 900e9]
    with pytest.raises(ValueError, match="differ"):
        best_of([slow, {**fast, "threads": 2}])

    row = {"precision": "int8", "floor_ms": 0.4, "floor_padded_ms": 0.8, "p50_ms": 1.0, "x_floor": 2.5}
    refloor(row, slow["peak_macs_per_s"], best["peak_macs_per_s"])
    assert row["floor_ms"] == pytest.approx(0.4 * 400 / 900)
    assert row["floor_padded_ms"] == pytest.approx(0.8 * 400 / 900)
    assert row["x_floor"] == pytest.approx(1.0 / row["floor_ms"])
