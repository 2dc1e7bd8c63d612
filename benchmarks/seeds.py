"""Several seeds of one recipe, side by side: the spread a single suite run cannot show.

Each argument is a results folder (or results.json) that ``benchmarks/suite.py`` wrote for one seed
of the same recipe, e.g. ``--only compress --set seed=1``. The teacher's accuracy comes from a folder
that measured the peers (a full run); the compress rows are matched by task and row name. Nothing
here measures anything: it reads the suite's own numbers and writes ``seeds.md``, ``seeds.json`` and
``seeds.png``.

    python benchmarks/seeds.py benchmarks/results/headline benchmarks/results/headline-seed1 \\
        benchmarks/results/headline-seed2 --out benchmarks/results/headline-seeds
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from compress.io import read_json, write_json_atomic, write_text_atomic


def load(path: Path) -> dict[str, Any]:
    file = path / "results.json" if path.is_dir() else path
    results = read_json(file)
    if not isinstance(results, dict) or "rows" not in results:
        raise SystemExit(
            f"{file}: not a suite results.json (no 'rows'); pass a benchmarks/suite.py --out folder"
        )
    results["_file"] = str(file)
    return results


def seed_of(results: dict[str, Any]) -> int:
    """The seed a run used: its --set seed=N override, else the recipes' default (0)."""
    words = results.get("command", "").split()
    for i, word in enumerate(words[:-1]):
        if word == "--set" and words[i + 1].startswith("seed="):
            return int(words[i + 1].removeprefix("seed="))
    return 0


def teacher_accuracy(runs: list[dict[str, Any]], task: str) -> float:
    for results in runs:
        for row in results["rows"]:
            if row["task"] == task and row["group"] == "teacher" and row["format"] == "torch":
                return float(row["accuracy"])
    raise SystemExit(
        f"no run measured the {task} teacher: include one full suite run (without --only compress)"
    )


def spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    seeds = [seed_of(r) for r in runs]
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"two runs share a seed ({seeds}): pass one results folder per seed")
    tasks: dict[str, Any] = {}
    for task in sorted({row["task"] for r in runs for row in r["rows"] if row["group"] == "compress"}):
        teacher = teacher_accuracy(runs, task)
        names = [row["row"] for row in runs[0]["rows"] if row["task"] == task and row["group"] == "compress"]
        rows = []
        for name in names:
            found = [
                next((x for x in r["rows"] if x["task"] == task and x["row"] == name), None) for r in runs
            ]
            if any(x is None for x in found):
                continue
            accuracy = [float(x["accuracy"]) for x in found]
            rows.append(
                {
                    "row": name,
                    "accuracy": dict(zip(map(str, seeds), accuracy, strict=True)),
                    "accuracy_spread": spread(accuracy),
                    "share_of_teacher": spread([a / teacher for a in accuracy]),
                    "bytes": spread([float(x["bytes"]) for x in found]),
                    "p50_ms": spread([float(x["p50_ms"]) for x in found]),
                }
            )
        tasks[task] = {"teacher_accuracy": teacher, "rows": rows}
    return {"seeds": seeds, "files": [r["_file"] for r in runs], "tasks": tasks}


def markdown(summary: dict[str, Any]) -> str:
    seeds = summary["seeds"]
    out = [
        "# Seeds of the headline recipe",
        "",
        f"Seeds {', '.join(map(str, seeds))}; one suite run each ({', '.join(summary['files'])}).",
        "Spread is the sample standard deviation over seeds; dev accuracy, measured once per seed.",
        "",
    ]
    for task, block in summary["tasks"].items():
        teacher = block["teacher_accuracy"]
        out += [
            f"## {task} (teacher {100 * teacher:.2f})",
            "",
            "| row | "
            + " | ".join(f"seed {s}" for s in seeds)
            + " | mean ± sd | % of teacher (min–max) | MB | p50 ms |",
            "|---|" + "---|" * len(seeds) + "---|---|---|---|",
        ]
        for row in block["rows"]:
            acc, share = row["accuracy_spread"], row["share_of_teacher"]
            per_seed = " | ".join(f"{100 * row['accuracy'][str(s)]:.2f}" for s in seeds)
            out.append(
                f"| {row['row']} | {per_seed} | {100 * acc['mean']:.2f} ± {100 * acc['std']:.2f} | "
                f"{100 * share['mean']:.1f}% ({100 * share['min']:.1f}–{100 * share['max']:.1f}) | "
                f"{row['bytes']['mean'] / 1e6:.2f} | {row['p50_ms']['mean']:.2f} |"
            )
        out.append("")
    return "\n".join(out)


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(summary["tasks"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(7 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        block = summary["tasks"][task]
        rows = block["rows"]
        for y, row in enumerate(rows):
            values = [100 * v / block["teacher_accuracy"] for v in row["accuracy"].values()]
            ax.scatter(values, [y] * len(values), color="tab:blue", s=30, zorder=3)
            ax.scatter([statistics.fmean(values)], [y], marker="|", s=300, color="black", zorder=4)
        for share, style in ((100, "-"), (99, "--"), (98, ":")):
            ax.axvline(share, color="grey", linestyle=style, linewidth=1)
        ax.set_yticks(range(len(rows)), [r["row"] for r in rows], fontsize=8)
        ax.set_xlabel("% of the teacher's dev accuracy (dots: seeds, bar: mean)")
        ax.set_title(f"{task}: teacher {100 * block['teacher_accuracy']:.2f}")
        ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="suite results folders, one per seed")
    parser.add_argument("--out", type=Path, required=True, help="folder for seeds.md/.json/.png")
    args = parser.parse_args()
    summary = aggregate([load(p) for p in args.runs])
    args.out.mkdir(parents=True, exist_ok=True)
    plot(summary, args.out / "seeds.png")
    write_text_atomic(args.out / "seeds.md", markdown(summary))
    write_json_atomic(args.out / "seeds.json", summary)
    print(json.dumps({t: [r["share_of_teacher"] for r in b["rows"]] for t, b in summary["tasks"].items()}))


if __name__ == "__main__":
    main()
