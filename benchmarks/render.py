"""results.json (the record), results.md (the tables), plot.png (accuracy against p50 latency per task)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import rows
from compress.io import write_json_atomic, write_text_atomic

FORMATS = {"torch": "pt", "onnx": "onnx", "tflite": "tflite", "pt2": "pt-compile"}
GROUPS = {
    "teacher": ("s", "black", "teacher, float"),
    "peer": ("^", "tab:red", "teacher, int8 one-liners"),
    "compress": ("o", "tab:blue", "compress"),
}
TASK_TITLES = {"sst2": "SST-2 dev", "mrpc": "MRPC dev"}


def short_label(row: dict[str, Any]) -> str:
    """A plot label: the step chain abbreviated, and the runtime."""
    label = row["label"]
    for long, short in (
        ("teacher, ORT dynamic int8", "ORT dyn int8"),
        ("teacher, ORT optimizer (O2 fusions) + dynamic int8", "ORT O2+dyn int8"),
        ("teacher, ai-edge-quantizer dynamic int8", "AEQ dyn int8"),
        ("teacher, neural-compressor PT2E static int8", "INC int8"),
        (" + share", "+sh"),
        (" + int8", "+i8"),
        ("distil ", ""),
    ):
        label = label.replace(long, short)
    return f"{label} {FORMATS[row['format']]}"


def _num(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def kept_cells(row: dict[str, Any]) -> list[str]:
    """The row's accuracy minus the teacher's, in points, and its share of it, each with its interval."""
    kept = row.get("accuracy_vs_teacher")
    if kept is None:
        return ["ref", "ref"] if rows.is_reference(row) else ["no interval", "no interval"]
    if "missing" in kept:
        return ["no interval", "no interval"]
    diff, ratio = kept["diff_points"], kept["ratio"]
    share = (
        f"{100 * ratio['estimate']:.1f} [{100 * ratio['low']:.1f}, {100 * ratio['high']:.1f}]"
        if ratio
        else "—"
    )
    return [f"{diff['estimate']:+.2f} [{diff['low']:+.2f}, {diff['high']:+.2f}]", share]


def interval_note(task_rows: list[dict[str, Any]]) -> list[str]:
    """How the intervals were computed, and why any row has none."""
    kept = [r["accuracy_vs_teacher"] for r in task_rows if r.get("accuracy_vs_teacher")]
    done = [k for k in kept if "missing" not in k]
    lines = []
    if done:
        first = done[0]
        lines.append(
            f"Intervals: {100 * first['confidence']:g}% paired bootstrap percentile intervals over the "
            f"{first['rows']} dev rows ({first['resamples']:,} resamples of rows, seed {first['seed']}), "
            f"against {first['vs']} scored on the same resampled rows."
        )
    for why in sorted({k["missing"] for k in kept if "missing" in k}):
        lines.append(f"No interval for some rows: {why}.")
    if not kept and any(not rows.is_reference(r) for r in task_rows):
        lines.append("No interval: these results keep no per-row predictions.")
    return ["", *lines] if lines else []


def task_table(task_rows: list[dict[str, Any]], with_f1: bool) -> list[str]:
    head = [
        "row",
        "accuracy",
        "Δ vs teacher, points [95% CI]",
        "% of teacher [95% CI]",
        *(["F1"] if with_f1 else []),
        "agreement",
        "p50 ms",
        "p90 ms",
        "items/s @32",
        "MB",
        "peak RSS MB",
        "MMACs",
        "floor ms",
        "p50 ÷ floor",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in task_rows:
        floor = _num(r["floor_ms"], 2) + (
            f" ({_num(r['floor_padded_ms'], 2)} padded)" if r.get("padded_to") else ""
        )
        cells = [
            r["row"],
            _num(100 * r["accuracy"], 2),
            *kept_cells(r),
            *([_num(100 * r["f1"], 2)] if with_f1 else []),
            "ref" if r["agreement"] is None else _num(100 * r["agreement"], 1),
            p50_cell(r),
            _num(r["p90_ms"], 2),
            _num(r["throughput_per_s"], 0),
            _num(r["bytes"] / 1e6, 1),
            _num(r["peak_rss_bytes"] / 1e6, 0),
            _num(r["macs"]["total"] / 1e6, 0),
            floor,
            _num(r["x_floor"], 1),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + rounds_note(task_rows) + interval_note(task_rows)


def p50_cell(row: dict[str, Any]) -> str:
    """The p50, with the min–max of its rounds when it was measured in interleaved rounds."""
    spread = row.get("rounds")
    if not spread:
        return _num(row["p50_ms"], 2)
    return f"{row['p50_ms']:.2f} [{spread['p50_min_ms']:.2f}–{spread['p50_max_ms']:.2f}]"


def rounds_note(task_rows: list[dict[str, Any]]) -> list[str]:
    counts = sorted({r["rounds"]["rounds"] for r in task_rows if r.get("rounds")})
    if not counts:
        return []
    slices = sorted({r["rounds"].get("slices", 1) for r in task_rows if r.get("rounds")})
    turns = (
        "every row in turn"
        if slices == [1]
        else f"each cut into {'/'.join(map(str, slices))} turns in which every row in turn times its "
        "share of the dev rows"
    )
    return [
        "",
        f"p50 and p90: median over {'/'.join(map(str, counts))} interleaved rounds ({turns}, "
        "alternating direction; each row's model loaded once); brackets: min–max of the rounds' p50.",
    ]


PART_NAMES = {"tokenize": "tokenise", "runtime": "runtime call", "postprocess": "post-process"}
BASELINE = "teacher, ORT dynamic int8"
"""The row the breakdown's p50 ratios are against: the int8 one-liner an ONNX Runtime user starts from."""


def parts_of(row: dict[str, Any]) -> dict[str, float] | None:
    """p50 ms of each part of a request: the rounds' medians, else the evaluation's single pass."""
    if row.get("rounds"):
        return row["rounds"].get("parts_ms")
    parts = (row.get("entry") or {}).get("metrics", {}).get("latency_ms", {}).get("parts")
    return {name: part["p50"] for name, part in parts.items()} if parts else None


def time_table(task_rows: list[dict[str, Any]]) -> list[str]:
    """Where each row's batch-1 request goes (p50 ms of tokenisation, the runtime call and
    post-processing) and its p50 against the ORT dynamic int8 teacher's; empty when no row timed parts."""
    if not any(parts_of(r) for r in task_rows):
        return []
    baseline = next((r for r in task_rows if r["label"] == BASELINE and r["format"] == "onnx"), None)
    head = ["row", "p50 ms", *(f"{n} p50" for n in PART_NAMES.values()), "runtime ÷ p50", f"p50 ÷ {BASELINE}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in task_rows:
        parts = parts_of(r) or {}
        runtime = parts.get("runtime")
        cells = [
            r["row"],
            _num(r["p50_ms"], 2),
            *(_num(parts.get(name), 3) for name in PART_NAMES),
            f"{100 * runtime / r['p50_ms']:.0f}%" if runtime is not None else "—",
            f"{r['p50_ms'] / baseline['p50_ms']:.2f}" if baseline else "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def op_table(task_rows: list[dict[str, Any]]) -> list[str]:
    """Where each ONNX row's runtime call goes by kind of kernel (``benchmarks/op_profile.py``): shares of
    the profiled run time, the session's time outside any kernel included; empty when nothing was profiled."""
    from benchmarks.op_profile import COLUMNS

    profiled = [r for r in task_rows if r.get("op_profile")]
    if not profiled:
        return []
    head = ["row", "profiled run µs", "outside kernels", *COLUMNS, "largest op type"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in profiled:
        prof = r["op_profile"]
        run = prof["run_us"]
        top = prof["ops"][0] if prof["ops"] else None
        cells = [
            r["row"],
            f"{run:.0f}",
            f"{100 * prof['outside_kernels']:.0f}%",
            *(f"{100 * prof['kinds_us'][kind] / run:.0f}%" for kind in COLUMNS),
            f"{top['op']} ×{top['nodes']} ({100 * top['us'] / run:.0f}%)" if top else "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def verdict_lines(verdict: dict[str, Any]) -> list[str]:
    if not verdict.get("headline"):
        return [f"Headline: {verdict.get('detail', 'not measured')}."]
    bar = f"{'keeps' if verdict['keeps_97pct'] else 'misses'} the 97% bar"
    interval = verdict.get("accuracy_share_interval")
    if interval:
        clears = "clears" if interval["low"] >= rows.ACCURACY_SHARE else "is below"
        bar += f"; 95% CI {100 * interval['low']:.1f}–{100 * interval['high']:.1f}%, its low end {clears} 97%"
    ahead = "strictly ahead of" if verdict["ahead_of_all"] else "not strictly ahead of"
    lines = [
        f"Headline **{verdict['headline']}**: {100 * verdict['accuracy_share']:.1f}% of the teacher's "
        f"accuracy ({bar}); {ahead} every peer row (faster at equal or better accuracy).",
        "",
    ]
    for a in verdict["against"]:
        faster = f"{1 / a['p50_ratio']:.2f}× faster" if a["faster"] else f"{a['p50_ratio']:.2f}× slower"
        mark = "" if not a["peer"] else (" ✔" if a["faster"] and a["as_accurate"] else " ✘")
        lines.append(f"- vs {a['row']}: {faster}, accuracy {100 * a['accuracy_delta']:+.2f} points{mark}")
    return lines


def targets_table(targets: list[dict[str, Any]]) -> list[str]:
    """Issue 16's and 19's targets for the headline recipe's int8 artifacts, met or missed, in this run."""

    def cell(value: float, target: float | None, fmt: str, at_least: bool = False) -> str:
        shown = fmt.format(value)
        if target is None:
            return shown
        met = value >= target if at_least else value <= target
        return f"**{shown}: met**" if met else f"{shown}: missed"

    out = [
        "| artifact | against | accuracy kept | bytes ÷ baseline (≤ 0.25) | p50 ÷ baseline (≤ 0.33) "
        "| p50 ÷ floor |",
        "|---|---|---|---|---|---|",
    ]
    for t in targets:
        kept_target = t["accuracy_target"]
        kept = cell(
            100 * t["accuracy_share"], None if kept_target is None else 100 * kept_target, "{:.1f}%", True
        )
        if kept_target is not None:
            kept += f" (≥ {100 * kept_target:.0f}%)"
        out.append(
            f"| {t['row']} | {t['baseline']} | {kept} | "
            f"{cell(t['bytes_ratio'], rows.ISSUE_TARGETS['bytes_ratio'], '{:.3f}')} | "
            f"{cell(t['p50_ratio'], rows.ISSUE_TARGETS['p50_ratio'], '{:.2f}')} | "
            f"{cell(t['x_floor'], t['x_floor_target'], '{:.1f}×')} (≤ {t['x_floor_target']:g}×) |"
        )
    return out


def commit_note(commit: dict[str, Any] | None) -> str:
    """`` at commit abc1234`` (``, with uncommitted changes``); results from before the suite recorded
    its commit say nothing."""
    if not commit:
        return ""
    return f" at commit {commit['sha'][:7]}" + (", with uncommitted changes" if commit["dirty"] else "")


def gemm_passes_note(gemm: dict[str, Any]) -> str:
    """``; each library's best of 2 passes (before and after the rows: 442 / 358 int8; ...)``, or nothing
    when the peaks come from one pass (results from before the suite measured twice)."""
    passes = gemm.get("passes") or []
    if len(passes) < 2:
        return ""
    per_library = "; ".join(
        " / ".join(f"{p['peak_macs_per_s'][k] / 1e9:.0f}" for p in passes) + f" {k}"
        for k in gemm["peak_macs_per_s"]
    )
    return f"; each library's best of {len(passes)} passes (before and after the rows: {per_library})"


def markdown(results: dict[str, Any]) -> str:
    gemm = results["gemm"]
    peaks = gemm["peak_macs_per_s"]
    versions = ", ".join(f"{k} {v}" for k, v in results["versions"].items())
    out = [
        "# compress benchmarks"
        + (" (quick harness check: small slices, not results)" if results["quick"] else ""),
        "",
        f"Measured {results['created']} on {results['host']['cpu']} ({results['host']['machine']}), "
        f"{results['host']['threads']} threads; suite wall time {results['suite_wall_s'] / 60:.1f} min.",
        f"Command: `{results['command']}`" + commit_note(results.get("commit")),
        "",
        f"GEMM peak ({gemm['size']}² matrices, {gemm['threads']} threads): "
        f"fp32 {peaks['fp32'] / 1e9:.0f} GMAC/s, "
        f"int8 {peaks['int8'] / 1e9:.0f} GMAC/s (best of "
        + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in gemm["macs_per_s"].items())
        + ")"
        + gemm_passes_note(gemm)
        + ".",
        "",
        f"Versions: {versions}.",
    ]
    for task in results["tasks"]:
        task_rows = [r for r in results["rows"] if r["task"] == task]
        if not task_rows:
            continue
        sample = task_rows[0]
        rows_n = sample["entry"]["metrics"]["latency_ms"]["samples"]
        out += [
            "",
            f"## {TASK_TITLES.get(task, task)} ({rows_n} latency samples, "
            f"mean {sample['mean_tokens']:.1f} tokens with the teacher's tokenizer)",
            "",
        ]
        out += task_table(task_rows, with_f1=task == "mrpc")
        breakdown = time_table(task_rows)
        if breakdown:
            out += [
                "",
                "Where a batch-1 request's time goes (p50 ms of each part; parts have their own medians, "
                "so they need not add up to the request's p50; the PyTorch inductor row is timed whole):",
                "",
                *breakdown,
            ]
        ops = op_table(task_rows)
        if ops:
            out += [
                "",
                "Where the ONNX Runtime call goes (ONNX Runtime's profiler over the same batch-1 requests, "
                "each row in a process of its own; shares of the profiled run time by kind of kernel, and "
                "outside any kernel: feeding inputs, allocating outputs, handing work to threads. The "
                "profiler slows every kernel call, so read shares, not times):",
                "",
                *ops,
            ]
        if task in results["headline"]:
            out += ["", *verdict_lines(results["headline"][task])]
            headline = (results.get("settings") or {}).get("headline")
            targets = rows.issue_targets(task_rows, task, headline.split(":")[0]) if headline else []
            if targets:
                out += [
                    "",
                    "Against the issues' targets in this run (accuracy kept of the teacher's PyTorch row; "
                    "bytes and p50 over the teacher's int8 row in the same format; p50 over the row's "
                    "compute floor, TFLite's padded):",
                    "",
                    *targets_table(targets),
                ]
    if results["recipes"]:
        out += [
            "",
            "## Compress recipes: what running them costs",
            "",
            "| task | recipe | wall min (incl. report) | stages min | peak RSS MB (pipeline) | "
            "peak RSS MB (incl. evaluation workers) |",
            "|---|---|---|---|---|---|",
        ]
        for run in results["recipes"]:
            stages = sum(s["seconds"] for s in run["stages"]) / 60
            out.append(
                f"| {run['task']} | {run['recipe']} | {run['wall_s'] / 60:.1f} | {stages:.1f} | "
                f"{run['pipeline_peak_rss_bytes'] / 1e6:.0f} | {run['peak_rss_bytes'] / 1e6:.0f} |"
            )
    return "\n".join(out) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from compress.plot_labels import Point, place_labels

    tasks = [t for t in results["tasks"] if any(r["task"] == t for r in results["rows"])]
    headline = {task: (results["headline"].get(task) or {}).get("headline") for task in tasks}
    fig, axes = plt.subplots(1, len(tasks), figsize=(8 * len(tasks), 6.5), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        task_rows = [r for r in results["rows"] if r["task"] == task]
        for group, (marker, colour, legend) in GROUPS.items():
            chosen = [r for r in task_rows if r["group"] == group]
            ax.scatter(
                [r["p50_ms"] for r in chosen],
                [100 * r["accuracy"] for r in chosen],
                marker=marker,
                color=colour,
                label=legend,
                s=40,
                zorder=3,
            )
        teacher = next((r for r in task_rows if r["group"] == "teacher" and r["format"] == "torch"), None)
        if teacher:
            ax.axhline(
                97 * teacher["accuracy"],
                color="grey",
                linestyle="--",
                linewidth=1,
                label="97% of the teacher's accuracy",
            )
        best = next((r for r in task_rows if r["row"] == headline[task]), None)
        if best:
            ax.scatter(
                [best["p50_ms"]],
                [100 * best["accuracy"]],
                marker="*",
                s=220,
                color="gold",
                edgecolor="black",
                zorder=4,
                label="headline",
            )
        ax.set_xscale("log")
        ax.set_xlabel("p50 latency, batch 1, ms (log)")
        ax.set_ylabel("accuracy, %")
        ax.set_title(
            f"{TASK_TITLES.get(task, task)}: accuracy vs latency ({results['host']['threads']} threads)"
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.margins(x=0.12, y=0.12)
        # below the axes, so no label can land under it
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    fig.tight_layout()
    for ax, task in zip(axes[0], tasks, strict=True):
        # names are placed in pixels once the layout is final (compress.plot_labels: never on one another)
        ax.set_xlim(ax.get_xlim())
        ax.set_ylim(ax.get_ylim())
        points = [
            Point(
                r["p50_ms"],
                100 * r["accuracy"],
                short_label(r),
                (220 if r["row"] == headline[task] else 40) ** 0.5 / 2,
            )
            for r in results["rows"]
            if r["task"] == task
        ]
        place_labels(ax, points, fontsize=7, zorder=5)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_all(results: dict[str, Any], out: Path) -> None:
    """plot.png and results.md first, results.json last: a results.json means the set is complete."""
    out.mkdir(parents=True, exist_ok=True)
    plot(results, out / "plot.png")
    write_text_atomic(out / "results.md", markdown(results))
    write_json_atomic(out / "results.json", json.loads(json.dumps(results, default=str)))
