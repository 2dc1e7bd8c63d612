"""Does a rerun agree? Two suite runs, every row's p50 over the same baseline row, side by side.

Latency on a shared machine moves with the minute it was measured in, so the suite's claims are
ratios to a row measured in the same rounds (by default the teacher through onnxruntime's
``quantize_dynamic``, the baseline of issue 16's latency target). Issue 19 asks that two suite runs
on one commit agree on every such ratio within 10%. This reads two results.json files (nothing here
measures anything), pairs their rows by task and name, and writes ``rerun.md``, ``rerun.json`` and
``rerun.png``: each row's ratio in both runs, the change, and whether it is within the tolerance;
the verdict holds only when both runs recorded the same commit with no uncommitted changes.

    python benchmarks/rerun.py benchmarks/results benchmarks/results/rerun-b --out benchmarks/results/rerun
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

if not __package__:  # run as ``python benchmarks/rerun.py``: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.render import commit_note
from benchmarks.seeds import load
from compress.io import write_json_atomic, write_text_atomic

BASELINE = "teacher, ORT dynamic int8 · ONNX Runtime int8"
TOLERANCE = 0.10


def same_commit(a: dict[str, Any], b: dict[str, Any]) -> tuple[bool, str]:
    """Whether both runs measured one committed tree, and what to say about it."""
    ca, cb = a.get("commit"), b.get("commit")
    if not ca or not cb:
        return False, "one run or both did not record its commit (measured before the suite did)"
    if ca["dirty"] or cb["dirty"]:
        return False, "a run had uncommitted changes, so its code is not a commit"
    if ca["sha"] != cb["sha"]:
        return False, f"different commits ({ca['sha'][:7]} and {cb['sha'][:7]})"
    return True, f"both at commit {ca['sha'][:7]}"


def ratios(results: dict[str, Any], baseline: str) -> dict[str, dict[str, dict[str, float]]]:
    """``{task: {row: {"p50_ms", "ratio"}}}``: every row's p50 over its task's baseline row's."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for task in results["tasks"]:
        rows = {r["row"]: r for r in results["rows"] if r["task"] == task and r.get("p50_ms")}
        if baseline not in rows:
            raise SystemExit(
                f"{results['_file']}: no row {baseline!r} for {task}; "
                "pass --baseline with a row every run has"
            )
        base = rows[baseline]["p50_ms"]
        out[task] = {name: {"p50_ms": r["p50_ms"], "ratio": r["p50_ms"] / base} for name, r in rows.items()}
    return out


def compare(
    a: dict[str, Any], b: dict[str, Any], baseline: str = BASELINE, tolerance: float = TOLERANCE
) -> dict[str, Any]:
    """Each row's ratio in both runs and its relative change; rows only one run has are listed apart."""
    ra, rb = ratios(a, baseline), ratios(b, baseline)
    same, why = same_commit(a, b)
    tasks: dict[str, Any] = {}
    for task in [t for t in ra if t in rb]:
        paired, only = [], sorted(set(ra[task]) ^ set(rb[task]))
        for name, first in ra[task].items():
            if name == baseline or name not in rb[task]:
                continue
            second = rb[task][name]
            change = second["ratio"] / first["ratio"] - 1
            paired.append(
                {
                    "row": name,
                    "p50_ms": [first["p50_ms"], second["p50_ms"]],
                    "ratio": [first["ratio"], second["ratio"]],
                    "change": change,
                    "within": abs(change) <= tolerance,
                }
            )
        tasks[task] = {
            "baseline_p50_ms": [ra[task][baseline]["p50_ms"], rb[task][baseline]["p50_ms"]],
            "rows": paired,
            "only_in_one_run": only,
        }
    if not tasks:
        raise SystemExit(f"{a['_file']} and {b['_file']} measured no task in common")
    every = all(r["within"] for t in tasks.values() for r in t["rows"])
    return {
        "runs": [
            {"file": r["_file"], "created": r.get("created"), "commit": r.get("commit")} for r in (a, b)
        ],
        "baseline": baseline,
        "tolerance": tolerance,
        "same_commit": same,
        "commit_note": why,
        "every_ratio_within": every,
        "agree": same and every,
        "tasks": tasks,
    }


def markdown(summary: dict[str, Any]) -> str:
    tol = f"{summary['tolerance']:.0%}"
    first, second = summary["runs"]
    out = [
        "# Does a rerun agree?",
        "",
        f"Run A: `{first['file']}`, {first['created']}{commit_note(first['commit'])}.  ",
        f"Run B: `{second['file']}`, {second['created']}{commit_note(second['commit'])}.",
        "",
        f"Every row's p50 over the p50 of **{summary['baseline']}** measured in the same run's rounds; "
        f"change = ratio in B ÷ ratio in A − 1; within = |change| ≤ {tol}.",
    ]
    for task, block in summary["tasks"].items():
        base = block["baseline_p50_ms"]
        out += [
            "",
            f"## {task} (baseline p50 {base[0]:.2f} ms in A, {base[1]:.2f} ms in B)",
            "",
            "| row | p50 ms A | p50 ms B | ratio A | ratio B | change | within |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in block["rows"]:
            out.append(
                f"| {r['row']} | {r['p50_ms'][0]:.2f} | {r['p50_ms'][1]:.2f} | {r['ratio'][0]:.3f} | "
                f"{r['ratio'][1]:.3f} | {r['change']:+.1%} | {'yes' if r['within'] else '**no**'} |"
            )
        if block["only_in_one_run"]:
            out += ["", "Measured in one run only: " + "; ".join(block["only_in_one_run"]) + "."]
    paired = [r for b in summary["tasks"].values() for r in b["rows"]]
    worst = max(paired, key=lambda r: abs(r["change"]), default=None)
    verdict = ("every ratio within " if summary["every_ratio_within"] else "not every ratio within ") + tol
    if worst is not None:
        verdict += f" (largest change {worst['change']:+.1%}: {worst['row']})"
    out += [
        "",
        f"**Verdict: {'the runs agree' if summary['agree'] else 'no agreement shown'}**: {verdict}; "
        f"{summary['commit_note']}.",
        "",
    ]
    return "\n".join(out)


def plot(summary: dict[str, Any], path: Path) -> None:
    """One bar per row: its ratio's change from run A to run B, against the tolerance band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(summary["tasks"])
    tol = 100 * summary["tolerance"]
    height = max(len(summary["tasks"][t]["rows"]) for t in tasks)
    fig, axes = plt.subplots(1, len(tasks), figsize=(7 * len(tasks), 1.2 + 0.35 * height), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        found = summary["tasks"][task]["rows"]
        changes = [100 * r["change"] for r in found]
        colors = ["tab:blue" if r["within"] else "tab:red" for r in found]
        ax.axvspan(-tol, tol, color="0.9", label=f"within ±{tol:.0f}%")
        ax.barh(range(len(found)), changes, color=colors)
        ax.set_yticks(range(len(found)), [r["row"] for r in found], fontsize=7)
        ax.invert_yaxis()
        ax.axvline(0, color="0.3", lw=0.8)
        top = max([abs(c) for c in changes] + [tol]) * 1.2
        ax.set(xlim=(-top, top), title=task, xlabel="change of p50 ÷ baseline, run B against run A (%)")
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"Does a rerun agree? p50 over {summary['baseline']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs=2, type=Path, help="two suite results folders (or results.json)")
    parser.add_argument("--out", type=Path, required=True, help="folder for rerun.md/.json/.png")
    parser.add_argument("--baseline", default=BASELINE, help="the row every p50 is divided by")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="largest relative change allowed")
    args = parser.parse_args(argv)
    summary = compare(load(args.runs[0]), load(args.runs[1]), args.baseline, args.tolerance)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(summary, args.out / "rerun.png")
    text = markdown(summary)
    write_text_atomic(args.out / "rerun.md", text)
    write_json_atomic(args.out / "rerun.json", summary)
    print(text.splitlines()[-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
