"""int8 against int4 embedding tables on finished headline runs: one fp32 ONNX export, quantized both ways.

For each suite work folder (``runs/benchmarks-headline/sst2`` ...) the run's fp32 ONNX artifact is quantized
with ``compress.quantize.onnx.quantize_onnx`` (dynamic, per-channel, as the arm64-onnx profile does) once with
int8 tables and once with ``embedding_bits=4``, and each artifact is measured through the bundle runner on the
run's held-out training rows (the only numbers a choice may use) and on dev (measured, never chosen on).

    python benchmarks/embedding_bits.py --shared ../shared --task sst2 \\
        runs/benchmarks-headline/sst2 runs/benchmarks-seed1/sst2 runs/benchmarks-seed2/sst2 \\
        --out benchmarks/results/headline-seeds/embedding_bits_sst2.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

if not __package__:  # run as ``python benchmarks/embedding_bits.py``: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

COLUMNS = {"sst2": ("sentence", None, "label"), "mrpc": ("#1 String", "#2 String", "Quality")}
# name -> quantize_onnx settings of the tables (dynamic, per-channel int8 everywhere else)
VARIANTS = {
    "int8": {"embedding_bits": 8},
    "int4": {"embedding_bits": 4},
    "int4-b16": {"embedding_bits": 4, "embedding_block": 16},
    "float-tables": {},  # a diagnosis, not a budget: every op type but Gather, so the tables stay fp32
}


def settings(name: str) -> dict:
    if name != "float-tables":
        return VARIANTS[name]
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    return {"op_types": [t for t in sorted(IntegerOpsRegistry) if t != "Gather"]}


def read_rows(path: Path, task: str) -> tuple[list[str], list[str] | None, np.ndarray]:
    """Texts, second texts and gold label ids of a task's TSV, read by compress's own loader."""
    from compress.data import load_file

    text, pair, label = COLUMNS[task]
    split = load_file(path, text=text, text_pair=pair, label=label)
    return split.texts, split.pairs, np.asarray(split.labels)


def measure(folder: Path, split: tuple[list[str], list[str] | None, np.ndarray]) -> np.ndarray:
    from compress.quantize import predict_logits

    return predict_logits(folder, split[0], split[1]).argmax(-1)


def shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (results never carry a machine's paths)."""
    repo = Path(__file__).resolve().parent.parent
    try:
        return str(path.resolve().relative_to(repo))
    except ValueError:
        return path.name if not path.is_absolute() else str(Path(*path.parts[-2:]))


def task_splits(shared: Path, task: str, holdout: int) -> tuple[Any, Any, Any]:
    """The suite's fit and held-out training rows (10% at most ``holdout``, seed 0) and dev, loaded."""
    import tempfile

    from benchmarks.compress_rows import holdout_split
    from compress.data import load_file

    text, pair, label = COLUMNS[task]
    with tempfile.TemporaryDirectory(prefix="bench-splits-") as tmp:
        fit, held = holdout_split(shared / "data" / task / "train.tsv", Path(tmp), 0.1, holdout, 0)
        train = load_file(fit, text=text, text_pair=pair, label=label)
        heldout = load_file(held, text=text, text_pair=pair, label=label)
    dev = load_file(shared / "data" / task / "dev.tsv", text=text, text_pair=pair, label=label)
    return train, heldout, dev


def parse_students(items: list[str]) -> list[tuple[str, Path]]:
    """``--student TASK=FOLDER`` arguments as (task, folder) pairs; a bad one stops the script with a line."""
    students = []
    for item in items:
        task, sep, folder = item.partition("=")
        if not sep or task not in COLUMNS or not Path(folder).is_dir():
            raise SystemExit(f"--student {item}: give TASK=FOLDER, TASK one of {sorted(COLUMNS)}")
        students.append((task, Path(folder)))
    return students


def write_results(out: Path, command: str, seconds: float, rows: list[dict], markdown: str) -> None:
    """``OUT.json`` (command, seconds, rows) and ``OUT.md`` beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"command": command, "seconds": round(seconds, 1), "rows": rows}
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown)
    print(f"wrote {out}.json and .md", file=sys.stderr)


def compare(
    work: Path, task: str, dev: tuple, scratch: Path, variants: tuple[str, ...] = ("int8", "int4")
) -> dict:
    from compress.quantize.onnx import quantize_onnx

    found = sorted(p for p in (work / "runs").iterdir() if p.is_dir())
    if len(found) != 1:
        raise SystemExit(f"{work / 'runs'}: expected one run folder, found {[p.name for p in found]}")
    run = found[0]
    fp32 = run / "03-export" / "arm64-onnx-fp32"
    held = read_rows(work / "data" / "heldout.tsv", task)
    folders = {"fp32": fp32}
    for name in variants:
        folders[name] = scratch / f"{work.parent.name}-{task}-{name}"
        quantize_onnx(fp32, folders[name], scheme="dynamic", per_channel=True, **settings(name))
    preds = {k: {"heldout": measure(f, held), "dev": measure(f, dev)} for k, f in folders.items()}
    out = {"run": shown(work), "rows": {"heldout": len(held[2]), "dev": len(dev[2])}}
    for name, folder in folders.items():
        entry = {"bytes": (folder / "model.onnx").stat().st_size}
        for split, gold in (("heldout", held[2]), ("dev", dev[2])):
            entry[f"{split}_accuracy"] = float((preds[name][split] == gold).mean())
            if name != "fp32":
                entry[f"{split}_agreement_fp32"] = float((preds[name][split] == preds["fp32"][split]).mean())
        out[name] = entry
    return out


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="suite work folders of one task (data/, runs/)")
    parser.add_argument("--task", choices=list(COLUMNS), required=True)
    parser.add_argument("--shared", type=Path, required=True, help="folder with data/<task>/dev.tsv")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        default=["int8", "int4"],
        help="table storages to compare",
    )
    args = parser.parse_args()
    dev = read_rows(args.shared / "data" / args.task / "dev.tsv", args.task)
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for work in args.runs:
            results.append(compare(work, args.task, dev, Path(scratch), tuple(args.variants)))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"task": args.task, "runs": results}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
