"""What each ALBERT-style transform costs a distilled student, and what recovery wins back.

Runs the ``share`` stage on a student checkpoint once per variant — layer sharing, factorised
embedding, vocabulary pruning (each alone, no recovery), all three without and with recovery
against the teacher — and records fp32 size (unique parameter bytes and the saved
model.safetensors) and dev accuracy next to the teacher's. Target: the all-three student keeps
>= 97% of the teacher's dev accuracy at <= 1/5 of the teacher's fp32 bytes.

    python benchmarks/share_benchmark.py --teacher ../shared/models/minilm-l6-sst2 \\
        --student runs/sst2/02-distill --train ../shared/data/sst2/train.tsv --dev ../shared/data/sst2/dev.tsv

The dev split is only measured: recovery picks its best epoch on --holdout training rows held out
(the same split benchmarks/suite.py makes, so a suite student saw none of them either).
Use --limit to try it on a slice; numbers from a slice are not results.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ACCURACY_SHARE = 0.97
SIZE_SHARE = 0.2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--teacher", type=Path, required=True, help="fine-tuned teacher folder (HF checkpoint)")
    p.add_argument("--student", type=Path, required=True, help="distilled student folder to compress")
    p.add_argument("--train", type=Path, required=True, help="training TSV (vocabulary + recovery)")
    p.add_argument("--dev", type=Path, required=True, help="dev TSV for accuracy")
    p.add_argument("--text", default="sentence", help="text column")
    p.add_argument("--label", default="label", help="label column")
    p.add_argument("--labels", default="negative,positive", help="label names in id order")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--embedding-rank", type=int, default=128)
    p.add_argument("--layers", default="{mode: all}", help="YAML of share.layers")
    p.add_argument("--vocab", default="{}", help="YAML of share.vocab")
    p.add_argument(
        "--positions",
        type=int,
        default=None,
        help="also trim the position table to N rows (a row of its own, and in the all-three rows)",
    )
    p.add_argument(
        "--recovery",
        default="{epochs: 3}",
        help="YAML of share.recovery (distill options); null skips the recovery row",
    )
    p.add_argument(
        "--holdout", type=int, default=500, help="training rows held out for recovery's best-epoch choice"
    )
    p.add_argument("--seed", type=int, default=0, help="training seed (the held-out split stays fixed)")
    p.add_argument(
        "--only",
        action="append",
        default=None,
        help="run only this variant (repeatable), e.g. --only 'all three + recovery' with another --seed",
    )
    p.add_argument("--limit", type=int, default=None, help="use only the first N rows of train and dev")
    p.add_argument(
        "--work-dir", type=Path, default=None, help="where checkpoints go (default: a temp folder)"
    )
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--name", default="share_benchmark", help="base name of the JSON and Markdown results")
    return p.parse_args(argv)


def write_recipe(args: argparse.Namespace, folder: Path) -> Path:
    if not __package__:  # run as ``python benchmarks/share_benchmark.py``
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.compress_rows import holdout_split

    fit, held = holdout_split(args.train.resolve(), folder / "data", 0.1, args.holdout, 0)
    limit = {"limit": args.limit} if args.limit else {}
    recipe = {
        "name": "share-benchmark",
        "seed": args.seed,
        "task": {
            "text": args.text,
            "label": args.label,
            "labels": args.labels.split(","),
            "max_length": args.max_length,
        },
        "teacher": {"path": str(args.teacher.resolve())},
        "data": {
            "train": {"path": str(fit), **limit},
            "eval": {"path": str(held), **limit},
            "test": {"path": str(args.dev.resolve()), **limit},
        },
        "stages": [{"type": "share", "vocab": {}, "recovery": None}],
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def variants(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    layers, vocab, recovery = (yaml.safe_load(v) for v in (args.layers, args.vocab, args.recovery))
    rank = args.embedding_rank
    chosen = {
        "layers": {"layers": layers, "recovery": None},
        "embedding": {"embedding_rank": rank, "recovery": None},
        "vocab": {"vocab": vocab, "recovery": None},
        "all three": {"layers": layers, "embedding_rank": rank, "vocab": vocab, "recovery": None},
        "all three + recovery": {
            "layers": layers,
            "embedding_rank": rank,
            "vocab": vocab,
            "recovery": recovery,
        },
    }
    if recovery is None:
        del chosen["all three + recovery"]
    if args.positions:
        chosen = {
            name: {**config, "positions": args.positions} if name.startswith("all three") else config
            for name, config in chosen.items()
        }
        chosen = {"positions": {"positions": args.positions, "recovery": None}, **chosen}
    unknown = set(args.only or ()) - set(chosen)
    if unknown:
        raise SystemExit(f"--only: unknown variant {sorted(unknown)}; variants: {', '.join(chosen)}")
    return {name: config for name, config in chosen.items() if not args.only or name in args.only}


def checkpoint_row(recipe: Any, name: str, folder: Path) -> dict[str, Any]:
    """Size and dev accuracy of an existing checkpoint (the teacher, the untouched student)."""
    from benchmarks.compress_rows import dev_logits
    from compress.models import load_classifier
    from compress.share.model import is_shared_folder, load_shared_classifier, parameter_stats
    from compress.training import classification_metrics

    model, tokenizer = load_shared_classifier(folder) if is_shared_folder(folder) else load_classifier(folder)
    logits, labels = dev_logits(recipe, model, tokenizer)
    return {
        "variant": name,
        **parameter_stats(model),
        **classification_metrics(logits, labels),
        "checkpoint_bytes": (folder / "model.safetensors").stat().st_size,
    }


def run_variant(recipe: Any, name: str, config: dict[str, Any], args: argparse.Namespace, work: Path) -> dict:
    """Run the share stage on the student with ``config``; its manifest metrics become the row."""
    from compress.api import run_stage
    from compress.stages import get_stage

    cfg = get_stage("share").config_cls.model_validate({"type": "share", **config})
    out = work / name.replace(" + ", "-plus-").replace(" ", "-")
    start = time.time()
    # variants share <work>/.cache: recovery computes the teacher's outputs once
    m = run_stage(recipe, out, config=cfg, teacher=args.teacher, model=args.student).metrics
    seconds = round(time.time() - start, 1)
    row = checkpoint_row(recipe, name, out)  # dev accuracy; the stage's own numbers are on the held-out rows
    row["heldout_accuracy"] = m["accuracy"]
    if config.get("recovery") is not None:
        row["heldout_accuracy_before_recovery"] = m["steps"][-2]["accuracy"]
    return {**row, "steps": m["steps"], "seconds": seconds}


def markdown(result: dict[str, Any]) -> str:
    teacher = result["rows"][0]
    scope = f"slice of {result['limit']} rows, not a result" if result["limit"] else "full data"
    lines = [
        f"# Share benchmark ({scope})",
        "",
        f"Teacher `{result['teacher']}`, student `{result['student']}`.",
        "",
        f"Layers: `{json.dumps(result['layers'])}`, embedding rank {result['embedding_rank']}, "
        f"vocabulary `{json.dumps(result['vocab'])}`"
        + (
            f", position table trimmed to {result['positions']} rows in the all-three rows"
            if result.get("positions")
            else ""
        )
        + f"; recovery `{json.dumps(result['recovery'])}`; seed {result.get('seed', 0)}.",
        "",
        "| variant | unique params | fp32 bytes | file bytes | × teacher bytes | held-out acc | dev acc "
        "| × teacher acc |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        heldout = row.get("heldout_accuracy")
        lines.append(
            f"| {row['variant']} | {row['parameters']:,} | {row['bytes']:,} | {row['checkpoint_bytes']:,} | "
            f"{row['checkpoint_bytes'] / teacher['checkpoint_bytes']:.3f} | "
            f"{'' if heldout is None else f'{heldout:.4f}'} | {row['accuracy']:.4f} | "
            f"{row['accuracy'] / teacher['accuracy']:.3f} |"
        )
    target = result["target"]
    if target is None:
        return "\n".join(lines) + "\n"
    lines += [
        "",
        f"Target (all three + recovery): accuracy >= {ACCURACY_SHARE:.0%} of the teacher's and checkpoint "
        f"<= {SIZE_SHARE:.0%} of its fp32 bytes: **{'met' if target['met'] else 'not met'}** "
        f"({target['accuracy_share']:.3f} of accuracy, {target['size_share']:.3f} of bytes).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from compress.recipe import load_recipe

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        work = (args.work_dir or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        recipe = load_recipe(write_recipe(args, work))
        rows = [
            checkpoint_row(recipe, "teacher", args.teacher),
            checkpoint_row(recipe, "student", args.student),
        ]
        rows += [run_variant(recipe, name, config, args, work) for name, config in variants(args).items()]
    teacher = rows[0]
    final = next((row for row in rows if row["variant"] == "all three + recovery"), None)
    target = None
    if final is not None:
        target = {
            "accuracy_share": final["accuracy"] / teacher["accuracy"],
            "size_share": final["checkpoint_bytes"] / teacher["checkpoint_bytes"],
        }
        target["met"] = target["accuracy_share"] >= ACCURACY_SHARE and target["size_share"] <= SIZE_SHARE
    result = {
        "teacher": str(args.teacher),
        "student": str(args.student),
        "train": str(args.train),
        "dev": str(args.dev),
        "limit": args.limit,
        "seed": args.seed,
        "embedding_rank": args.embedding_rank,
        "layers": yaml.safe_load(args.layers),
        "vocab": yaml.safe_load(args.vocab),
        "positions": args.positions,
        "recovery": yaml.safe_load(args.recovery),
        "rows": rows,
        "target": target,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(result))
    return result


if __name__ == "__main__":
    main()
