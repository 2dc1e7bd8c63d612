"""compress against what users would pick instead, on SST-2 and MRPC dev, measured in one run.

    python benchmarks/suite.py --shared ../shared            # full suite -> benchmarks/results/
    python benchmarks/suite.py --shared ../shared --quick    # small slices: checks the harness only

Rows per task: the teacher in float (PyTorch, ONNX Runtime, TFLite); the teacher through the int8
one-liners (onnxruntime dynamic per-channel, ai-edge-quantizer dynamic, neural-compressor PT2E
static + torch.compile); and every checkpoint and artifact of the compress recipes in
benchmarks/recipes/. Every row is measured by compress.evaluate (the torch.compile row by a worker
that reuses its measurement loop) with the same settings, and every row keeps the label it predicts
for each dev row, so its accuracy is given with a paired bootstrap interval against the teacher's
PyTorch fp32 row on the same rows. Latency is then measured again in interleaved rounds (every row's
model loaded once; each round cut into short turns in which every row in turn times a slice of the
dev rows; ``benchmarks/rounds.py``), and a row's p50 is the median of its rounds with their spread.
See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

if not __package__:  # run as ``python benchmarks/suite.py``: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import compress_rows, hardware, op_profile, peers, render, rounds, rows, torch_int8
from compress.metrics import RESAMPLES

log = logging.getLogger("benchmarks")
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Task:
    name: str
    data: Path
    teacher: Path
    text: str
    text_pair: str | None
    label: str


COLUMNS = {"sst2": ("sentence", None, "label"), "mrpc": ("#1 String", "#2 String", "Quality")}
"""Column names of the GLUE TSV files (``shared/README.md``)."""
TARGETS = {"onnx": "arm64-onnx", "tflite": "raspberry-pi-4"}
"""Peers use the same target profiles as the benchmark recipes, so fixed lengths and dtypes match."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--shared", type=Path, help="folder with data/{sst2,mrpc} and models/minilm-l6-{sst2,mrpc}"
    )
    for task in COLUMNS:
        p.add_argument(f"--{task}-dir", type=Path, help=f"{task} folder with train.tsv and dev.tsv")
        p.add_argument(f"--{task}-teacher", type=Path, help=f"fine-tuned {task} teacher (HF folder)")
    p.add_argument("--tasks", nargs="+", default=list(COLUMNS), choices=list(COLUMNS))
    p.add_argument(
        "--out", type=Path, help="results folder (default benchmarks/results; --quick: WORK/quick)"
    )
    p.add_argument("--work", type=Path, default=Path("runs/benchmarks"), help="run folders and peer models")
    p.add_argument(
        "--recipes",
        nargs="+",
        type=Path,
        default=[HERE / "recipes/distil3.yaml", HERE / "recipes/distil2.yaml"],
    )
    p.add_argument("--headline", default="distil3:onnx", help="RECIPE:FORMAT of the headline int8 artifact")
    p.add_argument("--epochs", type=int, help="epochs of every distill stage (default: the recipe's)")
    p.add_argument("--recovery-epochs", type=int, help="epochs of share recovery (default: the recipe's)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra override for every recipe (repeatable); TASK:KEY=VALUE (e.g. mrpc:seed=1) for one task's",
    )
    p.add_argument("--latency-samples", type=int, help="batch-1 requests timed (default: every dev row once)")
    p.add_argument(
        "--rounds",
        type=rows.positive_int,
        default=3,
        help="interleaved latency rounds per task (each row in turn); a row's p50 is their median",
    )
    p.add_argument(
        "--slices",
        type=rows.positive_int,
        default=16,
        help="turns per round: every row in turn times 1/SLICES of the dev rows, so rows alternate "
        "every second or two and share the machine's slow seconds (1: a whole pass per turn)",
    )
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads of every model and of the GEMM peaks (default 1; benchmarks/README.md says what "
        "one and two threads did to rerun agreement on this host)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="batch of the throughput pass")
    p.add_argument("--calibration-rows", type=int, default=128, help="training rows for static int8 (NC)")
    p.add_argument(
        "--holdout", type=int, default=500, help="training rows held out as the recipes' eval split"
    )
    p.add_argument(
        "--bootstrap-resamples",
        type=rows.positive_int,
        default=RESAMPLES,
        help="resamples of the paired bootstrap interval of each row's accuracy vs the teacher",
    )
    p.add_argument("--limit", type=int, help="use only the first N dev rows")
    p.add_argument("--train-limit", type=int, help="use only the first N training rows in the recipes")
    p.add_argument("--quick", action="store_true", help="small slices and 1 epoch: checks the harness")
    p.add_argument("--reuse", action="store_true", help="keep finished recipe stages and peer models")
    p.add_argument("--only", choices=["peers", "compress"], help="measure only these rows")
    args = p.parse_args(argv)
    if args.quick:
        args.limit, args.train_limit = args.limit or 48, args.train_limit or 256
        args.epochs, args.recovery_epochs = args.epochs or 1, args.recovery_epochs or 1
        args.holdout = min(args.holdout, 32)
        args.latency_samples, args.calibration_rows = (
            args.latency_samples or 24,
            min(args.calibration_rows, 16),
        )
    args.out = args.out or (args.work / "quick" if args.quick else HERE / "results")
    return args


def tasks_from(args: argparse.Namespace) -> list[Task]:
    out = []
    for name in args.tasks:
        data = getattr(args, f"{name}_dir") or (args.shared / "data" / name if args.shared else None)
        teacher = getattr(args, f"{name}_teacher") or (
            args.shared / "models" / f"minilm-l6-{name}" if args.shared else None
        )
        if data is None or teacher is None:
            raise SystemExit(f"error: give --shared or both --{name}-dir and --{name}-teacher")
        for path in (data / "train.tsv", data / "dev.tsv", teacher / "config.json"):
            if not path.is_file():
                raise SystemExit(f"error: {path} not found; check --shared / --{name}-dir / --{name}-teacher")
        out.append(Task(name, data.resolve(), teacher.resolve(), *COLUMNS[name]))
    return out


def recipe_overrides(
    task: Task, recipe: Path, fit: Path, held: Path, labels: list[str], args: argparse.Namespace
) -> list[str]:
    """``--set`` overrides pointing a task-agnostic recipe at one task, its data and the suite's settings.

    Values are written as JSON, which YAML reads back verbatim (``#1 String`` would otherwise be a comment).
    """
    values = {
        "name": f"{task.name}-{recipe.stem}",
        "teacher.path": str(task.teacher),
        "data.train.path": str(fit),
        "data.eval.path": str(held),
        "data.test.path": str(task.data / "dev.tsv"),
        "task.text": task.text,
        "task.text_pair": task.text_pair,
        "task.label": task.label,
        "task.labels": labels,
        "evaluate.warmup": args.warmup,
        "evaluate.threads": args.threads,
        "evaluate.throughput_batch": args.batch_size,
    }
    sets = [f"{key}={json.dumps(value)}" for key, value in values.items()]
    if args.latency_samples:
        sets.append(f"evaluate.latency_samples={args.latency_samples}")
    for split, limit in (("test", args.limit), ("train", args.train_limit)):
        if limit:
            sets.append(f"data.{split}.limit={limit}")
    for i, stage in enumerate(yaml.safe_load(recipe.read_text())["stages"]):
        if stage["type"] == "distill" and args.epochs:
            sets.append(f"stages.{i}.epochs={args.epochs}")
        elif stage["type"] == "share" and stage.get("recovery") is not None and args.recovery_epochs:
            sets.append(f"stages.{i}.recovery.epochs={args.recovery_epochs}")
    return sets + recipe_task_overrides(recipe, task.name) + task_overrides(args.overrides, task.name)


def recipe_task_overrides(recipe: Path, task: str) -> list[str]:
    """What a benchmark recipe sets for one task only, from ``tasks/<recipe file>`` beside it (a mapping of
    task names to lists of ``KEY=VALUE``): options only one task can take, such as MRPC's pair augmentation.
    They come before ``--set``, so a command-line override still wins; the run records them with the rest."""
    path = recipe.parent / "tasks" / recipe.name
    if not path.is_file():
        return []
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        first = (str(exc).strip().splitlines() or ["unreadable"])[0]
        raise SystemExit(f"error: {path}: not valid YAML ({first}); fix the file or remove it") from None
    valid = isinstance(data, dict) and all(
        name in COLUMNS and isinstance(sets, list) and all(isinstance(t, str) and "=" in t for t in sets)
        for name, sets in data.items()
    )
    if not valid:
        raise SystemExit(
            f"error: {path}: expected task names ({', '.join(COLUMNS)}) each with a list of KEY=VALUE "
            "overrides, e.g. mrpc: ['stages.0.augment={method: pairs}']"
        )
    return list(data.get(task, []))


def task_overrides(overrides: list[str], task: str) -> list[str]:
    """The ``--set`` overrides for ``task``: every plain ``KEY=VALUE`` and each ``TASK:KEY=VALUE`` of it
    (a pair-only option such as ``augment.swap_pairs`` goes to MRPC only)."""
    chosen = []
    for text in overrides:
        head, colon, rest = text.partition(":")
        if colon and head in COLUMNS and "=" not in head:
            if head == task:
                chosen.append(rest)
        else:
            chosen.append(text)
    return chosen


def peer_rows(
    task: Task, dev: Any, fit: Any, settings: Any, peaks: dict[str, float], work: Path, calibration_rows: int
) -> list[dict[str, Any]]:
    """The teacher's float exports, the int8 one-liners and the fused ORT expert path, all measured."""
    from compress.evaluate import evaluate_subject
    from compress.subjects import subject_at

    pairs = fit.pairs[:32] if fit.pairs else None
    models = peers.export_teacher(task.teacher, work, TARGETS, fit.texts[:32], pairs)
    models["onnx-int8"] = peers.ort_dynamic_int8(models["onnx"].path, work / "teacher-onnx-int8-ort")
    models["onnx-int8-fused"] = peers.ort_fused_dynamic_int8(
        task.teacher, models["onnx"].path, work / "teacher-onnx-int8-ort-fused"
    )
    models["tflite-int8"] = peers.aeq_dynamic_int8(models["tflite"].path, work / "teacher-tflite-int8-aeq")
    calib = sorted(random.Random(0).sample(range(len(fit)), min(calibration_rows, len(fit))))
    nc = torch_int8.nc_static_int8(
        task.teacher,
        work / "teacher-pt2e-int8-nc",
        [fit.texts[i] for i in calib],
        [fit.pairs[i] for i in calib] if fit.pairs else None,
        settings.max_length,
    )
    teacher = subject_at(task.teacher, teacher=True, name="teacher")
    teacher_entry, teacher_logits = evaluate_subject(teacher, dev, settings)
    out = [rows.make_row(task.name, "teacher", "teacher", teacher_entry, task.teacher, dev, peaks)]
    labels = {
        "onnx": "teacher",
        "tflite": "teacher",
        "onnx-int8": "teacher, ORT dynamic int8",
        "onnx-int8-fused": "teacher, ORT optimizer (O2 fusions) + dynamic int8",
        "tflite-int8": "teacher, ai-edge-quantizer dynamic int8",
    }
    for key, built in models.items():
        entry, _ = evaluate_subject(subject_at(built.path), dev, settings, teacher_logits)
        group = "teacher" if key in ("onnx", "tflite") else "peer"
        build = {"seconds": round(built.seconds, 1), "tool": built.tool}
        out.append(rows.make_row(task.name, group, labels[key], entry, task.teacher, dev, peaks, build=build))
    entry = torch_int8.evaluate_program(nc.path, dev, settings, teacher_logits)
    build = {"seconds": round(nc.seconds, 1), "tool": nc.tool, "compile_s": entry["compile_s"]}
    out.append(
        rows.make_row(
            task.name,
            "peer",
            "teacher, neural-compressor PT2E static int8",
            entry,
            task.teacher,
            dev,
            peaks,
            build=build,
        )
    )
    return out


def recipe_rows(
    task: Task, fit: Path, held: Path, dev: Any, peaks: dict[str, float], work: Path, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run each recipe as a user would (its own process), then read its rows from its report."""
    teacher_config = json.loads((task.teacher / "config.json").read_text())
    labels = [teacher_config["id2label"][k] for k in sorted(teacher_config["id2label"], key=int)]
    out, runs = [], []
    for recipe in args.recipes:
        sets = recipe_overrides(task, recipe, fit, held, labels, args)
        if not args.latency_samples:
            sets.append(f"evaluate.latency_samples={len(dev)}")
        log.info("%s: running recipe %s", task.name, recipe.name)
        run = compress_rows.run_recipe_process(
            recipe, work / "runs", sets, work / f"{recipe.stem}.log", fresh=not args.reuse
        )
        runs.append(
            {
                "task": task.name,
                "recipe": recipe.stem,
                "run_dir": str(run.run_dir),
                "wall_s": run.wall_s,
                "cpu_s": run.cpu_s,
                "peak_rss_bytes": run.peak_rss_bytes,
                "pipeline_peak_rss_bytes": run.pipeline_peak_rss_bytes,
                "stages": run.stages,
                "overrides": sets,
            }
        )
        for found in compress_rows.report_rows(run, teacher_config["num_hidden_layers"]):
            row = rows.make_row(
                task.name,
                "compress",
                found["label"],
                found["entry"],
                found["checkpoint"],
                dev,
                peaks,
                recipe=recipe.stem,
            )
            if found["gold"] is not None and found["gold"] != dev.labels:
                row["accuracy_vs_teacher"] = {"missing": "its run measured other dev rows than the suite"}
            out.append(row)
    return out, runs


def measure_task(
    task: Task, args: argparse.Namespace, peaks: dict[str, float]
) -> tuple[list[dict], list[dict], list[int]]:
    """The task's rows (each with its interval vs the teacher), its recipe runs and its dev gold labels."""
    from compress.data import load_file
    from compress.evaluate import Settings
    from compress.subjects import subject_at

    work = (args.work / task.name).resolve()
    if work.exists() and not args.reuse:
        shutil.rmtree(work)
    fit_path, held_path = compress_rows.holdout_split(
        task.data / "train.tsv", work / "data", 0.1, args.holdout, 0
    )
    labels = subject_at(task.teacher, teacher=True).label_names
    columns = {"text": task.text, "text_pair": task.text_pair, "label": task.label, "label_names": labels}
    dev, fit = load_file(task.data / "dev.tsv", **columns), load_file(fit_path, **columns)
    if args.limit:
        dev = dev.subset(list(range(min(args.limit, len(dev)))))
    if args.train_limit:
        fit = fit.subset(list(range(min(args.train_limit, len(fit)))))
    settings = Settings(
        latency_samples=args.latency_samples or len(dev),
        warmup=args.warmup,
        batch_size=args.batch_size,
        threads=args.threads,
        max_length=128,
        bootstrap_resamples=args.bootstrap_resamples,
    )
    found, runs = [], []
    if args.only != "compress":
        found += peer_rows(task, dev, fit, settings, peaks, work / "peers", args.calibration_rows)
    if args.only != "peers":
        compress_found, runs = recipe_rows(task, fit_path, held_path, dev, peaks, work, args)
        found += compress_found
    rows.add_intervals(found, dev.labels, args.bootstrap_resamples)
    log.info(
        "%s: %d interleaved latency rounds of %d turns over %d rows",
        task.name,
        args.rounds,
        args.slices,
        len(found),
    )
    rounds.measure_rounds(
        found,
        dev.texts,
        dev.pairs,
        args.rounds,
        args.warmup,
        args.latency_samples or len(dev),
        slices=args.slices,
    )
    log.info("%s: profiling the ONNX rows' runtime calls by op type", task.name)
    op_profile.profile_rows(found, dev.texts, dev.pairs, args.warmup, args.latency_samples or len(dev))
    return found, runs, dev.labels


def cpu_seconds() -> float:
    """CPU time of the suite and every process it waited for: on a busy machine, a check on the wall time."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


REPO = Path(__file__).resolve().parent.parent


def portable(value: Any, roots: list[Path]) -> Any:
    """``value`` with every absolute path under one of ``roots`` written relative to the repository
    (``runs/...``, ``../shared/...``), so a results.json reads the same on every machine it lands on."""
    if isinstance(value, dict):
        return {key: portable(item, roots) for key, item in value.items()}
    if isinstance(value, list):
        return [portable(item, roots) for item in value]
    if not isinstance(value, str):
        return value
    for root in roots:
        label = Path(os.path.relpath(root, REPO)).as_posix()
        here = re.escape(root.as_posix())
        value = re.sub(here + "/", "" if label == "." else f"{label}/", value)
        value = re.sub(here + r"(?![\w.-])", label, value)
    return value


def source_commit() -> dict[str, Any] | None:
    """The commit the suite ran from and whether tracked files differed from it (None outside git),
    so two results.json can say whether they measured the same code (``benchmarks/rerun.py``)."""

    def git(*words: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO), *words], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        return {
            "sha": git("rev-parse", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        }
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for ours in ("benchmarks", "compress"):
        logging.getLogger(ours).setLevel(logging.INFO)
    from compress.pipeline import library_versions
    from compress.runtime.runner import cpu_model

    start = time.time()
    tasks = tasks_from(args)
    log.info("measuring the GEMM peaks at %d threads", args.threads)
    gemm = hardware.gemm_peaks(args.threads)
    all_rows, all_runs, gold = [], [], {}
    for task in tasks:
        found, runs, gold[task.name] = measure_task(task, args, gemm["peak_macs_per_s"])
        all_rows += found
        all_runs += runs
    log.info("measuring the GEMM peaks again; the floors use each library's best pass")
    first, gemm = gemm, hardware.best_of([gemm, hardware.gemm_peaks(args.threads)])
    for row in all_rows:
        rows.refloor(row, first["peak_macs_per_s"], gemm["peak_macs_per_s"])
    recipe, fmt = args.headline.split(":")
    verdicts = (
        {
            t.name: rows.headline_verdict([r for r in all_rows if r["task"] == t.name], recipe, fmt)
            for t in tasks
        }
        if args.only is None
        else {}
    )
    results = {
        "schema": "compress.benchmarks/1",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/suite.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "quick": args.quick,
        "commit": source_commit(),
        "host": {"cpu": cpu_model(), "machine": platform.machine(), "threads": args.threads},
        "versions": library_versions(),
        "gemm": gemm,
        "settings": {
            "latency_samples": args.latency_samples or "every dev row",
            "latency_rounds": args.rounds,
            "latency_slices": args.slices,
            "warmup": args.warmup,
            "threads": args.threads,
            "throughput_batch": args.batch_size,
            "limit": args.limit,
            "train_limit": args.train_limit,
            "epochs": args.epochs,
            "recovery_epochs": args.recovery_epochs,
            "headline": args.headline,
            "bootstrap_resamples": args.bootstrap_resamples,
        },
        "tasks": {
            t.name: {"data": str(t.data), "teacher": str(t.teacher), "gold": gold[t.name]} for t in tasks
        },
        "rows": all_rows,
        "recipes": all_runs,
        "headline": verdicts,
        "suite_wall_s": round(time.time() - start, 1),
        "suite_cpu_s": round(cpu_seconds(), 1),
    }
    # deepest root first, so a ../shared inside the repository is not caught by the repository's own root
    shared = [Path(os.path.abspath(args.shared)), args.shared.resolve()] if args.shared else []
    roots = sorted({REPO, *shared}, key=lambda r: -len(r.parts))
    results = portable(results, roots)
    render.write_all(results, args.out)
    log.info("done in %.1f min: %s", results["suite_wall_s"] / 60, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
