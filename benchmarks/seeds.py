"""Several seeds of one recipe, side by side: the spread a single suite run cannot show.

Each argument is a results folder (or results.json) that ``benchmarks/suite.py`` wrote for one seed
of the same recipe, e.g. ``--only compress --set seed=1``; a seed may also come as one folder per task
(two single-task runs), but never two folders of one seed and task. The teacher's accuracy comes from a folder
that measured the peers (a full run): one of the seeds, or ``--teacher FOLDER``, a full run of another
recipe (only its teacher rows are read, so its own compress rows are no seed here); the compress rows are
matched by task and row name. Nothing here measures anything: it reads the suite's own numbers and writes
``seeds.md``, ``seeds.json`` and ``seeds.png``. It lists where each run was measured (time, machine,
commit); when the runs span machines, p50 is given per seed, never averaged over them.

From the per-row predictions each results.json keeps, every row gets the paired bootstrap interval
of its accuracy against that teacher row, per seed, and pooled over the seeds: each resample draws
one set of dev rows and scores every seed and the teacher on it (they were all measured on the same
rows), then averages the seeds' accuracies. The pooled interval is the row-sampling uncertainty of
the seed-averaged accuracy kept; the seed-to-seed spread is the sd column beside it.

    python benchmarks/seeds.py benchmarks/results/headline benchmarks/results/headline-seed1 \\
        benchmarks/results/headline-seed2 --out benchmarks/results/headline-seeds
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

if not __package__:  # run as ``python benchmarks/seeds.py``: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.rows import is_reference, positive_int
from compress.errors import CompressError
from compress.io import read_json, write_json_atomic, write_text_atomic
from compress.metrics import RESAMPLES, paired_accuracy_interval, pooled_accuracy_interval


def load(path: Path) -> dict[str, Any]:
    file = path / "results.json" if path.is_dir() else path
    try:
        results = read_json(file)
    except CompressError as exc:  # missing or unreadable: its one-line message, no traceback
        raise SystemExit(f"error: {exc}") from None
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


def teacher_row(runs: list[dict[str, Any]], task: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The teacher PyTorch fp32 row of ``task`` and the results it came from."""
    for results in runs:
        for row in results["rows"]:
            if row["task"] == task and is_reference(row):
                return row, results
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


def provenance(results: dict[str, Any], teacher_only: bool = False) -> dict[str, Any]:
    """Where and from what one run measured: its file, seed, commit, machine and time (``None`` where the
    results predate the suite recording it)."""
    commit, host = results.get("commit") or {}, results.get("host") or {}
    return {
        "file": results["_file"],
        "seed": None if teacher_only else seed_of(results),
        "commit": commit.get("sha"),
        "dirty": commit.get("dirty"),
        "cpu": host.get("cpu"),
        "threads": host.get("threads"),
        "created": results.get("created"),
    }


def gold_of(results: dict[str, Any], task: str) -> list[int] | None:
    return ((results.get("tasks") or {}).get(task) or {}).get("gold")


def seed_intervals(
    found: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    seeds: list[int],
    task: str,
    teacher: tuple[dict[str, Any], dict[str, Any]],
    resamples: int,
) -> dict[str, Any]:
    """Each seed's interval of the accuracy kept and the pooled one, or ``{"missing": why}`` for each
    that cannot be computed (no predictions kept, or a run measured other dev rows)."""
    row, source = teacher
    gold, reference = gold_of(source, task), (row.get("entry") or {}).get("predictions")
    per_seed: dict[str, Any] = {}
    usable = []
    for seed, results, x in zip(seeds, runs, found, strict=True):
        mine = (x.get("entry") or {}).get("predictions")
        if gold is None or reference is None or mine is None:
            per_seed[str(seed)] = {"missing": "no per-row predictions (measured before the suite kept them)"}
        elif gold_of(results, task) != gold or len(mine) != len(gold):
            per_seed[str(seed)] = {"missing": "measured on other dev rows than the teacher row"}
        else:
            per_seed[str(seed)] = paired_accuracy_interval(mine, reference, gold, resamples=resamples)
            usable.append(mine)
    if len(usable) == len(found):
        pooled = pooled_accuracy_interval(usable, reference, gold, resamples=resamples)
    else:
        pooled = {"missing": f"{len(found) - len(usable)} of {len(found)} seeds have none, so no pooled one"}
    return {"vs": row["row"], "per_seed": per_seed, "pooled": pooled}


def tasks_of(results: dict[str, Any]) -> set[str]:
    return {row["task"] for row in results["rows"] if row["group"] == "compress"}


def runs_by_seed(runs: list[dict[str, Any]], task: str) -> dict[int, dict[str, Any]]:
    """The one run of each seed that measured ``task``'s compress rows (a seed may come as one run per
    task, e.g. two single-task suite runs of seed 0)."""
    found: dict[int, dict[str, Any]] = {}
    for results in runs:
        if task not in tasks_of(results):
            continue
        seed = seed_of(results)
        if seed in found:
            raise SystemExit(
                f"two runs share seed {seed} for {task} ({found[seed]['_file']}, {results['_file']}): "
                "pass one results folder per seed and task"
            )
        found[seed] = results
    return found


def aggregate(
    runs: list[dict[str, Any]], resamples: int = RESAMPLES, teacher_run: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``teacher_run``: results whose teacher rows are the reference (default: the teacher rows among
    ``runs``)."""
    seeds = sorted({seed_of(r) for r in runs})
    tasks: dict[str, Any] = {}
    for task in sorted(set().union(*(tasks_of(r) for r in runs))):
        by_seed = runs_by_seed(runs, task)
        missing = [s for s in seeds if s not in by_seed]
        if missing:
            raise SystemExit(
                f"no run of seed {missing[0]} measured {task}: pass its results folder too, or drop the seed"
            )
        task_runs = [by_seed[s] for s in seeds]
        reference = teacher_row([teacher_run] if teacher_run is not None else runs, task)
        teacher = float(reference[0]["accuracy"])
        names = [
            row["row"] for row in task_runs[0]["rows"] if row["task"] == task and row["group"] == "compress"
        ]
        rows = []
        for name in names:
            found = [
                next((x for x in r["rows"] if x["task"] == task and x["row"] == name), None)
                for r in task_runs
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
                    "p50_ms_per_seed": {
                        str(s): float(x["p50_ms"]) for s, x in zip(seeds, found, strict=True)
                    },
                    "accuracy_vs_teacher": seed_intervals(
                        found, task_runs, seeds, task, reference, resamples
                    ),
                }
            )
        tasks[task] = {"teacher_accuracy": teacher, "rows": rows}
    files = [r["_file"] for r in runs]
    measured = [provenance(teacher_run, teacher_only=True)] if teacher_run is not None else []
    measured += [provenance(r) for r in runs]
    return {
        "seeds": seeds,
        "files": files,
        "teacher": (teacher_run or {}).get("_file"),
        "runs": measured,
        "machines": sorted({m["cpu"] for m in measured if m["cpu"]}),
        "tasks": tasks,
    }


def runs_table(summary: dict[str, Any]) -> list[str]:
    """One line per results file: seed, when, on what machine, at which commit; and a warning when the
    runs were measured on more than one machine (their p50s are then no one machine's spread)."""
    out = ["| results | seed | measured | machine | commit |", "|---|---|---|---|---|"]
    for m in summary.get("runs", []):
        seed = "teacher rows only" if m["seed"] is None else str(m["seed"])
        commit = (m["commit"] or "")[:7] or "not recorded"
        commit += " (uncommitted changes)" if m["dirty"] else ""
        machine = m["cpu"] or "not recorded"
        machine += f", {m['threads']} thread{'s' if m['threads'] != 1 else ''}" if m["threads"] else ""
        out.append(f"| {m['file']} | {seed} | {m['created'] or 'not recorded'} | {machine} | {commit} |")
    machines = summary.get("machines", [])
    if len(machines) > 1:
        out += [
            "",
            f"**Measured on {len(machines)} machines** ({'; '.join(machines)}): p50 is given per seed, "
            "since a mean over machines is no machine's latency; an int8 file's accuracy may also move "
            "with the machine's rounding. Compare latency within one suite run.",
        ]
    return [*out, ""]


def _share(interval: dict[str, Any]) -> str:
    ratio = interval.get("ratio")
    if "missing" in interval or not ratio:
        return "no interval"
    return f"{100 * ratio['estimate']:.1f} [{100 * ratio['low']:.1f}, {100 * ratio['high']:.1f}]"


def _points(interval: dict[str, Any]) -> str:
    if "missing" in interval:
        return "no interval"
    diff = interval["diff_points"]
    return f"{diff['estimate']:+.2f} [{diff['low']:+.2f}, {diff['high']:+.2f}]"


def interval_table(block: dict[str, Any], seeds: list[int]) -> list[str]:
    """Per seed and pooled: % of the teacher's accuracy [95% CI]; pooled also in points."""
    kept = [row.get("accuracy_vs_teacher") or {"per_seed": {}, "pooled": {}} for row in block["rows"]]
    per_seed = [v for k in kept for v in k["per_seed"].values()]
    if not any("missing" not in v for v in per_seed):  # nothing to tabulate: say why once
        why = sorted({v["missing"] for v in per_seed}) or ["these results keep no per-row predictions"]
        return [*[f"No interval: {w}." for w in why], ""]
    reasons = sorted(
        {v["missing"] for k in kept for v in [*k["per_seed"].values(), k["pooled"]] if "missing" in v}
    )
    out = [
        "| row | "
        + " | ".join(f"seed {s}: % of teacher [95% CI]" for s in seeds)
        + " | pooled: % of teacher [95% CI] | pooled: Δ points [95% CI] |",
        "|---|" + "---|" * len(seeds) + "---|---|",
    ]
    for row, k in zip(block["rows"], kept, strict=True):
        cells = [_share(k["per_seed"][str(s)]) for s in seeds] + [_share(k["pooled"]), _points(k["pooled"])]
        out.append(f"| {row['row']} | " + " | ".join(cells) + " |")
    first = next((k for k in kept if k["pooled"] and "missing" not in k["pooled"]), None)
    if first:
        pooled = first["pooled"]
        out += [
            "",
            f"Against {first['vs']}, on the same {pooled['rows']} dev rows: paired bootstrap "
            f"({pooled['resamples']:,} resamples, seed {pooled['seed']}); pooled draws one set of rows "
            "per resample for every seed and averages their accuracies (row noise of the seed mean; "
            "the seed spread is the sd above).",
        ]
    return [*out, *[f"No interval where {why}." for why in reasons], ""]


def markdown(summary: dict[str, Any]) -> str:
    seeds = summary["seeds"]
    out = [
        "# Seeds of the headline recipe",
        "",
        f"Seeds {', '.join(map(str, seeds))}; one suite run each ({', '.join(summary['files'])})."
        + (f" Teacher rows from {summary['teacher']}." if summary.get("teacher") else ""),
        "Spread is the sample standard deviation over seeds; dev accuracy, measured once per seed.",
        "",
        *runs_table(summary),
    ]
    mixed = len(summary.get("machines", [])) > 1
    for task, block in summary["tasks"].items():
        teacher = block["teacher_accuracy"]
        out += [
            f"## {task} (teacher {100 * teacher:.2f})",
            "",
            "| row | "
            + " | ".join(f"seed {s}" for s in seeds)
            + " | mean ± sd | % of teacher (min–max) | MB | "
            + ("p50 ms per seed |" if mixed else "p50 ms |"),
            "|---|" + "---|" * len(seeds) + "---|---|---|---|",
        ]
        for row in block["rows"]:
            acc, share = row["accuracy_spread"], row["share_of_teacher"]
            per_seed = " | ".join(f"{100 * row['accuracy'][str(s)]:.2f}" for s in seeds)
            by_seed = row.get("p50_ms_per_seed") or {}
            p50 = (
                " / ".join(f"{by_seed[str(s)]:.2f}" for s in seeds)
                if mixed and by_seed
                else f"{row['p50_ms']['mean']:.2f}"
            )
            out.append(
                f"| {row['row']} | {per_seed} | {100 * acc['mean']:.2f} ± {100 * acc['std']:.2f} | "
                f"{100 * share['mean']:.1f}% ({100 * share['min']:.1f}–{100 * share['max']:.1f}) | "
                f"{row['bytes']['mean'] / 1e6:.2f} | {p50} |"
            )
        out += ["", *interval_table(block, seeds)]
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
    parser.add_argument(
        "--teacher",
        type=Path,
        help="a full suite run whose teacher rows are the reference (when no seed's run measured the peers)",
    )
    parser.add_argument(
        "--bootstrap-resamples", type=positive_int, default=RESAMPLES, help="resamples of each interval"
    )
    args = parser.parse_args()
    teacher = load(args.teacher) if args.teacher else None
    summary = aggregate([load(p) for p in args.runs], args.bootstrap_resamples, teacher)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(summary, args.out / "seeds.png")
    write_text_atomic(args.out / "seeds.md", markdown(summary))
    write_json_atomic(args.out / "seeds.json", summary)
    print(f"wrote {args.out}/seeds.md, seeds.json and seeds.png", file=sys.stderr)


if __name__ == "__main__":
    main()
