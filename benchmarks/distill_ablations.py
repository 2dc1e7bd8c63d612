"""Distillation ablations on SST-2 and MRPC: which loss terms and how many layers keep the teacher's accuracy.

Each ablation is a one-stage recipe (``type: distill``), validated like a user's, whose stage handler
runs alone (without the pipeline's final evaluation/report, which measures latency and is not what
is compared here). Runs of one task share a cache folder, so the teacher's outputs are computed
once per layer set and reused. Writes ``<results>/<name>.json`` and ``.md`` (``--name``, default
``distill_ablations``).

The dev split is only measured: each run picks its best epoch on training rows held out from the
transfer set (``--holdout``, at most 10% of the file: the same fixed split as the suite and the share
benchmark), never on dev.

    python benchmarks/distill_ablations.py --shared ../shared --epochs 3
    python benchmarks/distill_ablations.py --shared ../shared --limit 200 --epochs 1   # smoke test
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

if not __package__:  # run as ``python benchmarks/distill_ablations.py``: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ABLATIONS: list[tuple[str, dict[str, Any]]] = [
    ("soft", {"layers": 3, "weights": {"soft": 1.0}}),
    ("soft+hard", {"layers": 3, "weights": {"soft": 1.0, "hard": 1.0}}),
    ("soft+hard+hidden(cos)", {"layers": 3, "weights": {"soft": 1.0, "hard": 1.0, "hidden": 1.0}}),
    ("+augment", {"layers": 3, "weights": {"soft": 1.0, "hard": 1.0, "hidden": 1.0}, "augment": {}}),
    ("2 layers, soft+hard+hidden(cos)", {"layers": 2, "weights": {"soft": 1.0, "hard": 1.0, "hidden": 1.0}}),
    # Issue 16: what the headline's soft-only distillation gains from more epochs or a larger transfer set.
    ("soft, 6 epochs", {"layers": 3, "weights": {"soft": 1.0}, "epochs": 6, "patience": 2}),
    ("soft+augment", {"layers": 3, "weights": {"soft": 1.0}, "augment": {}}),
    # MiniLM's self-attention relations of the last layers beside soft targets, and TinyBERT's two steps
    # (inner-layer terms for one epoch, then soft targets for three).
    ("soft+relation", {"layers": 3, "weights": {"soft": 1.0, "relation": 1.0}}),
    (
        "two-step: relation, then soft",
        {"layers": 3, "weights": {"soft": 1.0, "relation": 1.0}, "epochs": 4, "intermediate_epochs": 1},
    ),
    (
        "two-step: hidden(cos)+attention, then soft",
        {
            "layers": 3,
            "weights": {"soft": 1.0, "hidden": 1.0, "attention": 1.0},
            "epochs": 4,
            "intermediate_epochs": 1,
        },
    ),
    # Issue 16: which teacher layers the student starts from. every-other (0, 2, 4) drops the teacher's
    # last layer, so the student's top layer starts from one the pooler and classifier never read;
    # these keep it (0, 2, 5: the first and last; 1, 3, 5: every other from the top).
    ("soft, init 0-2-5", {"layers": 3, "init": [0, 2, 5], "weights": {"soft": 1.0}}),
    ("soft, init 1-3-5", {"layers": 3, "init": [1, 3, 5], "weights": {"soft": 1.0}}),
    # Issue 16, more transfer data that reads like the task's own: phrases cut from each training
    # sentence (contiguous word spans), teacher-labelled, as SST-2's phrase-level set was cut from its trees.
    (
        "soft+spans x4",
        {"layers": 3, "weights": {"soft": 1.0}, "augment": {"method": "spans", "multiplier": 4}},
    ),
    # Issue 16, pair tasks: every training pair also in the other order (teacher-labelled), which
    # doubles MRPC's 3,302-pair transfer set without inventing words.
    (
        "soft+swapped pairs",
        {"layers": 3, "weights": {"soft": 1.0}, "augment": {"multiplier": 0, "swap_pairs": True}},
    ),
    # Issue 16, pair tasks: new pairs of the task's own sentences, each first sentence with the two
    # second sentences of other pairs that share most of its words (related, rarely paraphrases: the
    # kind of near miss MRPC's negatives are), teacher-labelled; triples the transfer set.
    (
        "soft+neighbour pairs x2",
        {"layers": 3, "weights": {"soft": 1.0}, "augment": {"method": "pairs", "multiplier": 2}},
    ),
    # Issue 16, ELECTRA's replaced-token detection beside soft targets: a second pass over each batch with
    # 15% of the word tokens swapped for embedding neighbours, the student telling which were replaced.
    ("soft+rtd", {"layers": 3, "weights": {"soft": 1.0, "rtd": 1.0}}),
    # Issue 16, MRPC: is the 3-layer student's gap capacity? The same soft targets with a fourth layer
    # (teacher layers 0, 1, 3, 4: every-other spaces 4 of 6 layers 1.5 apart).
    ("soft, 4 layers", {"layers": 4, "weights": {"soft": 1.0}}),
]
TASKS = {
    "sst2": {"text": "sentence", "label": "label"},
    "mrpc": {"text": "#1 String", "text_pair": "#2 String", "label": "Quality"},
}


def recipe_for(
    task: str, split: dict[str, Path], teacher: Path, stage: dict[str, Any], args: argparse.Namespace
) -> dict:
    """``split`` maps train (fit rows), eval (held-out training rows) and test (dev) to TSV files."""
    limit = {"limit": args.limit} if args.limit else {}
    return {
        "name": f"distill-{task}",
        "seed": args.seed,
        "task": {**TASKS[task], "max_length": args.max_length},
        "teacher": {"path": str(teacher.resolve())},
        "data": {name: {"path": str(path.resolve()), **limit} for name, path in split.items()},
        "stages": [{"type": "distill", **stage}],
    }


def split_for(data: Path, work: Path, args: argparse.Namespace) -> dict[str, Path]:
    """Fit rows, held-out training rows (epoch choice) and dev (measured only)."""
    from benchmarks.compress_rows import holdout_split

    fit, held = holdout_split((data / "train.tsv").resolve(), work / "data", 0.1, args.holdout, 0)
    return {"train": fit, "eval": held, "test": data / "dev.tsv"}


def checkpoint_dev_logits(recipe: Any, folder: Path) -> tuple[Any, list[int]]:
    """Dev logits and labels of the checkpoint in ``folder``."""
    from benchmarks.compress_rows import dev_logits
    from compress.models import load_classifier

    return dev_logits(recipe, *load_classifier(folder))


def run_ablation(
    task: str, split: dict[str, Path], teacher: Path, name: str, spec: dict[str, Any], args, teacher_dev: dict
) -> dict[str, Any]:
    """Run the recipe's distill stage alone (``compress.api.run_stage``: no report/evaluation) with a
    per-task cache.

    Accuracy and agreement are measured on dev against the teacher's dev logits, kept per task in
    ``teacher_dev``."""
    from compress.api import run_stage
    from compress.recipe import load_recipe
    from compress.training import classification_metrics

    stage = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "patience": args.patience,
        **spec,
    }
    if "augment" in stage:
        stage["augment"] = {"multiplier": args.augment_multiplier, "method": "embedding", **stage["augment"]}
    slug = name.replace(" ", "_").replace(",", "").replace("(", "-").replace(")", "")
    run_dir = args.work / task
    recipe_path = run_dir / f"{slug}.yaml"
    recipe_path.parent.mkdir(parents=True, exist_ok=True)
    recipe_path.write_text(yaml.safe_dump(recipe_for(task, split, teacher, stage, args), sort_keys=False))
    recipe = load_recipe(recipe_path)
    out = run_dir / slug
    start = time.time()
    # the run's folders share <run_dir>/.cache, so the teacher's outputs are computed once per layer set
    m = run_stage(recipe, out, teacher=teacher.resolve()).metrics
    if task not in teacher_dev:
        teacher_dev[task] = checkpoint_dev_logits(recipe, teacher.resolve())[0]
    reference = teacher_dev[task]
    logits, labels = checkpoint_dev_logits(recipe, out)
    dev = classification_metrics(logits, labels, reference)
    teacher_accuracy = classification_metrics(reference, labels)["accuracy"]
    return {
        "task": task,
        "ablation": name,
        "layers": spec["layers"],
        "weights": spec["weights"],
        "augment_multiplier": stage["augment"]["multiplier"] if "augment" in stage else None,
        "swap_pairs": bool(stage.get("augment", {}).get("swap_pairs")),
        "teacher_accuracy": teacher_accuracy,
        "accuracy": dev["accuracy"],
        "agreement": dev["agreement"],
        "retained": dev["accuracy"] / teacher_accuracy if teacher_accuracy else None,
        "heldout_accuracy": m["accuracy"],
        "heldout_teacher_accuracy": m["teacher_accuracy"],
        # mean KL(teacher ‖ student) on the held-out rows at the kept epoch: finer than accuracy there
        "heldout_kl": m["kl"],
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
        "Accuracy and agreement are on dev, which no run saw; each run kept its best epoch on held-out "
        "training rows (held-out acc; held-out KL is the mean KL divergence of the student's "
        "probabilities from the teacher's on those rows, in nats).",
        "",
        "| task | ablation | layers | params | teacher acc | student acc | retained | agreement "
        "| held-out acc | held-out KL | best epoch | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['ablation']} | {r['layers']} | {r['parameters'] / 1e6:.1f}M | "
            f"{r['teacher_accuracy']:.4f} | {r['accuracy']:.4f} | {r['retained']:.1%} | "
            f"{r['agreement']:.4f} | {r['heldout_accuracy']:.4f} | "
            f"{r['heldout_kl']:.4f} | {r['best_epoch']}/{r['epochs_run']} | "
            f"{r['stage_seconds']:.0f} |"
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
    parser.add_argument(
        "--limit", type=int, default=None, help="use only the first N rows of each split (fit, held-out, dev)"
    )
    parser.add_argument("--augment-multiplier", type=int, default=2)
    parser.add_argument(
        "--holdout",
        type=int,
        default=500,
        help="training rows held out for each run's best-epoch choice (at most 10%% of the file)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("runs/benchmarks/distill"))
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    parser.add_argument(
        "--name", default="distill_ablations", help="results file stem (<results>/<name>.json and .md)"
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.work = args.work.resolve()
    rows = []
    teacher_dev: dict[str, Any] = {}
    for task in args.tasks:
        data = getattr(args, f"{task}_data") or (args.shared / "data" / task if args.shared else None)
        teacher = getattr(args, f"{task}_teacher") or (
            args.shared / "models" / f"minilm-l6-{task}" if args.shared else None
        )
        if data is None or teacher is None:
            parser.error(f"give --shared or both --{task}-data and --{task}-teacher")
        split = split_for(data, args.work / task, args)
        for name, spec in ABLATIONS:
            if args.only and name not in args.only:
                continue
            if spec.get("augment", {}).get("swap_pairs") and "text_pair" not in TASKS[task]:
                logging.info("%s: %s skipped (a pair-task method; %s has one text)", task, name, task)
                continue
            logging.info("%s: %s", task, name)
            rows.append(run_ablation(task, split, teacher, name, spec, args, teacher_dev))
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
        in (
            "epochs",
            "batch_size",
            "lr",
            "patience",
            "max_length",
            "limit",
            "augment_multiplier",
            "holdout",
            "seed",
        )
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"{args.name}.json").write_text(
        json.dumps({"settings": settings, "rows": rows}, indent=2)
    )
    (args.results / f"{args.name}.md").write_text(markdown(rows, settings))
    print(markdown(rows, settings))


if __name__ == "__main__":
    main()
