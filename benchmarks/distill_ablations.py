"""Distillation ablations on SST-2 and MRPC: which loss terms and how many layers keep the teacher's accuracy.

Each ablation is a one-stage recipe (``type: distill``), validated like a user's, whose stage handler
runs alone (without the pipeline's final evaluation/report, which measures latency and is not what
is compared here). Runs of one task share a cache folder, so the teacher's outputs are computed
once per layer set and reused. Writes ``<results>/distill_ablations.json`` and ``.md``.

    python benchmarks/distill_ablations.py --shared ../shared --epochs 3
    python benchmarks/distill_ablations.py --shared ../shared --limit 200 --epochs 1   # smoke test
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import yaml

ABLATIONS: list[tuple[str, dict[str, Any]]] = [
    ("soft", {"layers": 3, "weights": {"soft": 1.0}}),
    ("soft+hard", {"layers": 3, "weights": {"soft": 1.0, "hard": 1.0}}),
    ("soft+hard+hidden(cos)", {"layers": 3, "weights": {"soft": 1.0, "hard": 1.0, "hidden": 1.0}}),
    ("+augment", {"layers": 3, "weights": {"soft": 1.0, "hard": 1.0, "hidden": 1.0}, "augment": {}}),
    ("2 layers, soft+hard+hidden(cos)", {"layers": 2, "weights": {"soft": 1.0, "hard": 1.0, "hidden": 1.0}}),
]
TASKS = {
    "sst2": {"text": "sentence", "label": "label"},
    "mrpc": {"text": "#1 String", "text_pair": "#2 String", "label": "Quality"},
}


def recipe_for(task: str, data: Path, teacher: Path, stage: dict[str, Any], args: argparse.Namespace) -> dict:
    limit = {"limit": args.limit} if args.limit else {}
    return {
        "name": f"distill-{task}",
        "seed": args.seed,
        "task": {**TASKS[task], "max_length": args.max_length},
        "teacher": {"path": str(teacher.resolve())},
        "data": {
            "train": {"path": str((data / "train.tsv").resolve()), **limit},
            "eval": {"path": str((data / "dev.tsv").resolve()), **limit},
        },
        "stages": [{"type": "distill", **stage}],
    }


def run_ablation(
    task: str, data: Path, teacher: Path, name: str, spec: dict[str, Any], args
) -> dict[str, Any]:
    """Run the distill stage handler alone (no report/evaluation stages) with a per-task cache."""
    import shutil

    from compress.recipe import load_recipe
    from compress.stages import get_stage
    from compress.stages.base import StageContext

    stage = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "patience": args.patience,
        **spec,
    }
    if "augment" in stage:
        stage["augment"] = {"multiplier": args.augment_multiplier, "method": "embedding"}
    slug = name.replace(" ", "_").replace(",", "").replace("(", "-").replace(")", "")
    run_dir = args.work / task
    recipe_path = run_dir / f"{slug}.yaml"
    recipe_path.parent.mkdir(parents=True, exist_ok=True)
    recipe_path.write_text(yaml.safe_dump(recipe_for(task, data, teacher, stage, args), sort_keys=False))
    recipe = load_recipe(recipe_path)
    out = run_dir / slug
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    ctx = StageContext(
        recipe=recipe,
        config=recipe.stages[0],
        index=1,
        out_dir=out,
        run_dir=run_dir,
        teacher_dir=teacher.resolve(),
        input_dir=teacher.resolve(),
        previous=[],
        cache_dir=run_dir / ".cache",
        seed=recipe.seed,
    )
    start = time.time()
    m = get_stage("distill").run(ctx).metrics
    return {
        "task": task,
        "ablation": name,
        "layers": spec["layers"],
        "weights": spec["weights"],
        "augment_multiplier": args.augment_multiplier if "augment" in spec else None,
        "teacher_accuracy": m["teacher_accuracy"],
        "accuracy": m["accuracy"],
        "agreement": m["agreement"],
        "retained": m["accuracy"] / m["teacher_accuracy"] if m["teacher_accuracy"] else None,
        "parameters": m["parameters"],
        "teacher_parameters": m["source_parameters"],
        "epochs_run": m["epochs_run"],
        "best_epoch": m["best_epoch"],
        "train_rows": m["train_rows"],
        "stage_seconds": m["wall_time_s"],
        "total_seconds": round(time.time() - start, 1),
        "loss_curves": m["loss_curves"],
    }


def markdown(rows: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    lines = [
        "# Distillation ablations",
        "",
        f"Settings: {json.dumps(settings)}",
        "",
        "| task | ablation | layers | params | teacher acc | student acc | retained | agreement "
        "| epochs | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['ablation']} | {r['layers']} | {r['parameters'] / 1e6:.1f}M | "
            f"{r['teacher_accuracy']:.4f} | {r['accuracy']:.4f} | {r['retained']:.1%} | "
            f"{r['agreement']:.4f} | {r['epochs_run']} | {r['stage_seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, help="folder with data/<task>/ and models/minilm-l6-<task>/")
    for task in TASKS:
        parser.add_argument(f"--{task}-data", type=Path, help=f"{task} folder with train.tsv and dev.tsv")
        parser.add_argument(f"--{task}-teacher", type=Path, help=f"fine-tuned {task} teacher folder")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--only", nargs="+", help="run only these ablation names")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--patience", type=int, default=None)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None, help="use only the first N train and dev rows")
    parser.add_argument("--augment-multiplier", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("runs/benchmarks/distill"))
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.work = args.work.resolve()
    rows = []
    for task in args.tasks:
        data = getattr(args, f"{task}_data") or (args.shared / "data" / task if args.shared else None)
        teacher = getattr(args, f"{task}_teacher") or (
            args.shared / "models" / f"minilm-l6-{task}" if args.shared else None
        )
        if data is None or teacher is None:
            parser.error(f"give --shared or both --{task}-data and --{task}-teacher")
        for name, spec in ABLATIONS:
            if args.only and name not in args.only:
                continue
            logging.info("%s: %s", task, name)
            rows.append(run_ablation(task, data, teacher, name, spec, args))
            logging.info(
                "%s: %s -> accuracy %.4f (teacher %.4f) in %.0fs",
                task,
                name,
                rows[-1]["accuracy"],
                rows[-1]["teacher_accuracy"],
                rows[-1]["stage_seconds"],
            )
    settings = {
        k: v
        for k, v in vars(args).items()
        if k
        in ("epochs", "batch_size", "lr", "patience", "max_length", "limit", "augment_multiplier", "seed")
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "distill_ablations.json").write_text(
        json.dumps({"settings": settings, "rows": rows}, indent=2)
    )
    (args.results / "distill_ablations.md").write_text(markdown(rows, settings))
    print(markdown(rows, settings))


if __name__ == "__main__":
    main()
