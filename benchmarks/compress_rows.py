"""The compress rows: a recipe run exactly as a user runs it, timed, and read back from its own report.

``compress run`` ends by evaluating the teacher, every checkpoint and every artifact through
``compress.evaluate`` on the recipe's test split, so the suite makes the benchmark's dev split the
recipe's ``test`` split and the evaluation settings the suite's: the compress rows are then measured
by the same code, with the same settings, as the peer rows. The recipe's ``eval`` split (used for
best-epoch selection and quantization checks) is a held-out slice of the training file, so nothing
in a run ever sees the dev split before it is measured.

Child process: ``python -m benchmarks.compress_rows RECIPE OUT_DIR RESULT.json [--fresh] [KEY=VALUE ...]``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compress.io import read_json

STEP_NAMES = {"share": "share", "quantize": "int8"}


@dataclass(frozen=True)
class RecipeRun:
    name: str
    run_dir: Path
    wall_s: float
    peak_rss_bytes: int
    """Largest resident set of the recipe process or any worker it started (ru_maxrss via wait4)."""
    pipeline_peak_rss_bytes: int
    """The recipe process alone: training, export and quantization, without the evaluation workers."""
    stages: list[dict[str, Any]]
    cpu_s: float
    """User + system CPU seconds of the recipe process and every worker it started."""


def holdout_split(train: Path, out_dir: Path, fraction: float, max_rows: int, seed: int) -> tuple[Path, Path]:
    """Split a TSV's lines into fit and held-out files (header kept), without parsing or re-quoting them."""
    header, *rows = train.read_text(encoding="utf-8").splitlines(keepends=True)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[: min(max_rows, max(1, int(len(rows) * fraction)))])
    out_dir.mkdir(parents=True, exist_ok=True)
    fit_path, held_path = out_dir / "train.tsv", out_dir / "heldout.tsv"
    fit_path.write_text(header + "".join(r for i, r in enumerate(rows) if i not in held), encoding="utf-8")
    held_path.write_text(header + "".join(r for i, r in enumerate(rows) if i in held), encoding="utf-8")
    return fit_path, held_path


def dev_logits(recipe: Any, model: Any, tokenizer: Any) -> tuple[Any, list[int]]:
    """Logits of ``model`` on the recipe's ``test`` split (the benchmark's dev split), and its labels."""
    from compress.data import load_recipe_split
    from compress.training import encode, predict_logits

    dev = load_recipe_split(recipe, "test")
    return predict_logits(model, encode(tokenizer, dev, recipe.task.max_length)), dev.labels


def run_recipe_process(
    recipe: Path, out_dir: Path, overrides: list[str], log_path: Path, fresh: bool
) -> RecipeRun:
    """Run one recipe in a child process; time it and take its peak memory from the kernel (wait4)."""
    result_path = log_path.with_suffix(".json")
    root = Path(__file__).resolve().parent.parent
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p),
    )
    command = [
        sys.executable,
        "-m",
        "benchmarks.compress_rows",
        str(recipe),
        str(out_dir),
        str(result_path),
        *(["--fresh"] if fresh else []),
        *overrides,
    ]
    start = time.time()
    with open(log_path, "w", encoding="utf-8") as log_file:
        proc = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.time() - start
    if os.waitstatus_to_exitcode(status) != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RuntimeError(f"recipe {recipe} failed (log {log_path}):\n{tail}")
    child = read_json(result_path)
    return RecipeRun(
        child["name"],
        Path(child["run_dir"]),
        round(wall, 1),
        usage.ru_maxrss * 1024,
        child["peak_rss_bytes"],
        child["stages"],
        round(usage.ru_utime + usage.ru_stime, 1),
    )


def int8_step(scheme: str) -> str:
    return "int8" if scheme == "dynamic" else f"int8 {scheme}"


def step_labels(run_dir: Path, teacher_layers: int) -> dict[str, str]:
    """``{stage folder: "distil 6→3 + share + int8"}``: what has been done to the model by that stage."""
    steps: list[str] = ["teacher"]
    labels = {}
    for stage in read_json(run_dir / "run.json")["stages"]:
        config = read_json(run_dir / stage["dir"] / "manifest.json")["config"]
        if stage["type"] == "distill":
            steps = [f"distil {teacher_layers}→{config['layers']}"]
        elif stage["type"] == "quantize":  # several quantize stages each start from the same checkpoint
            scheme = config.get("scheme", "dynamic")
            labels[stage["dir"]] = " + ".join(
                [*steps, int8_step(scheme if isinstance(scheme, str) else "dynamic")]
            )
            continue
        elif stage["type"] in STEP_NAMES:
            steps.append(STEP_NAMES[stage["type"]])
        labels[stage["dir"]] = " + ".join(steps)
    return labels


def report_rows(run: RecipeRun, teacher_layers: int) -> list[dict[str, Any]]:
    """The run's checkpoints and artifacts from its report.json, each with its label and source folders,
    and the gold labels of the rows the report measured (None from a report that does not keep them)."""
    report = read_json(run.run_dir / "report.json")
    labels = step_labels(run.run_dir, teacher_layers)
    schemes = {  # each stage's configured scheme, read once
        stage["dir"]: read_json(run.run_dir / stage["dir"] / "manifest.json")["config"].get("scheme")
        for stage in read_json(run.run_dir / "run.json")["stages"]
    }
    rows = []
    for entry in [*report["checkpoints"], *report["artifacts"]]:
        stage_dir = entry["name"].split("/")[0]
        folder = Path(entry["path"])
        manifest = read_json(folder / "manifest.json") if entry["format"] != "torch" else {}
        checkpoint = Path(manifest["source"]["checkpoint"]) if manifest else folder
        label = labels[stage_dir]
        scheme = schemes.get(stage_dir)
        if manifest and isinstance(scheme, dict):  # a scheme per target: this artifact's own
            label = label.removesuffix(int8_step("dynamic")) + int8_step(scheme[manifest["target"]])
        rows.append(
            {
                "label": label,
                "entry": entry,
                "checkpoint": checkpoint,
                "stage": stage_dir,
                "target": manifest.get("target"),
                "gold": (report.get("data") or {}).get("gold"),
            }
        )
    # several targets of one format (a TFLite phone and a Pi profile): say which row is which
    targets: dict[str, set[str]] = {}
    for row in rows:
        if row["target"]:
            targets.setdefault(row["entry"]["format"], set()).add(row["target"])
    for row in rows:
        if row["target"] and len(targets[row["entry"]["format"]]) > 1:
            row["label"] += f" ({row['target']})"
    return rows


def main(argv: list[str]) -> int:
    """The child: run the recipe with overrides; write its name, run folder, stage times and own peak RSS."""
    from compress.pipeline import run_recipe
    from compress.recipe import load_recipe

    recipe_path, out_dir, result_path, *rest = argv
    fresh = "--fresh" in rest
    overrides = [a for a in rest if a != "--fresh"]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s compress: %(message)s", "%H:%M:%S"))
    ours = logging.getLogger("compress")
    ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False
    recipe = load_recipe(recipe_path, overrides)
    result = run_recipe(recipe, Path(out_dir), fresh=fresh)
    stages = [
        {"dir": s.dir.name, "type": s.type, "seconds": s.seconds, "reused": s.reused} for s in result.stages
    ]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    Path(result_path).write_text(
        json.dumps(
            {"name": recipe.name, "run_dir": str(result.run_dir), "stages": stages, "peak_rss_bytes": peak}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
