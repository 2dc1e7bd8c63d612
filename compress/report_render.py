"""Render a report dict for people: a Markdown page and an accuracy-vs-latency plot.

Everything shown is read from report.json, so ``compress report RUN`` can redraw both without
running a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compress.io import atomic_path
from compress.run_layout import REPORT_PLOT

Entry = dict[str, Any]


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}f}"


def _signed(value: float | None, digits: int = 4) -> str:
    return "–" if value is None else f"{value:+.{digits}f}"


def _lat(entry: Entry, key: str) -> float | None:
    return (entry["metrics"].get("latency_ms") or {}).get(key)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def entries(report: dict[str, Any]) -> list[Entry]:
    """Teacher first, then checkpoints, then artifacts: the order a model moves through a run."""
    first = [report["teacher"]] if report.get("teacher") else []
    return first + report.get("checkpoints", []) + report.get("artifacts", [])


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def kept_cells(entry: Entry) -> tuple[str, str]:
    """The paired bootstrap interval of the accuracy kept, as two cells: the difference in points and
    the share of the teacher's accuracy. An entry without per-row predictions (a report written before
    compress kept them) says it has no interval rather than showing a blank."""
    kept = entry["metrics"].get("accuracy_vs_teacher")
    if kept:
        diff, ratio = kept["diff_points"], kept.get("ratio")
        share = (
            f"{100 * ratio['estimate']:.1f}% [{100 * ratio['low']:.1f}, {100 * ratio['high']:.1f}]"
            if ratio
            else "–"
        )
        return f"[{diff['low']:+.2f}, {diff['high']:+.2f}]", share
    if entry["role"] != "teacher" and entry.get("predictions") is None:
        return "no interval", "no interval"
    return "–", "–"


def interval_note(report: dict[str, Any]) -> list[str]:
    """A paragraph (and its blank line) on how the intervals were computed, or why there are none."""
    for e in entries(report):
        kept = e["metrics"].get("accuracy_vs_teacher")
        if kept:
            return [
                f"CI: {100 * kept['confidence']:g}% paired bootstrap percentile interval over the "
                f"{kept.get('rows', '–')} rows ({kept['resamples']:,} resamples of rows, seed "
                f"{kept.get('seed', '–')}): each resample scores the model and the teacher on the same rows.",
                "",
            ]
    if any(e["role"] != "teacher" and e.get("predictions") is None for e in entries(report)):
        return [
            "No interval: this report keeps no per-row predictions (an older compress wrote it); "
            "delete report.json and run `compress report RUN` to evaluate the run again.",
            "",
        ]
    return []


def quality_table(report: dict[str, Any]) -> list[str]:
    teacher_acc = (report.get("teacher") or {}).get("metrics", {}).get("accuracy")
    rows = []
    for e in entries(report):
        m = e["metrics"]
        known = teacher_acc is not None and m.get("accuracy") is not None and e["role"] != "teacher"
        drop = m["accuracy"] - teacher_acc if known else None
        rows.append(
            [
                f"`{e['name']}`",
                e["format"],
                e.get("target") or "–",
                e.get("precision") or "–",
                _num(m.get("accuracy")),
                _signed(drop),
                *kept_cells(e),
                _num(m.get("f1")),
                _num(m.get("macro_f1")),
                _num(m.get("agreement")),
                _num(m.get("mean_kl"), 5),
                _num(m.get("max_abs_logit_diff")),
            ]
        )
    header = [
        "model",
        "format",
        "target",
        "precision",
        "accuracy",
        "Δ acc vs teacher",
        "Δ acc CI, points",
        "acc kept [CI]",
        "F1 (pos.)",
        "macro F1",
        "agreement",
        "mean KL",
        "max abs Δ logit",
    ]
    return _table(header, rows)


def cost_table(report: dict[str, Any]) -> list[str]:
    teacher = report.get("teacher") or {}
    t_p50, t_bytes = (_lat(teacher, "p50") if teacher else None), teacher.get("bytes")
    rows = []
    for e in entries(report):
        m, where = e["metrics"], e.get("measured", {})
        speedup, smaller = _ratio(t_p50, _lat(e, "p50")), _ratio(t_bytes, e.get("bytes"))
        rows.append(
            [
                f"`{e['name']}`",
                _num(_lat(e, "p50"), 2),
                _num(_lat(e, "p90"), 2),
                _num(_lat(e, "p99"), 2),
                f"{speedup:.2f}×" if speedup else "–",
                _num((m.get("throughput") or {}).get("items_per_s"), 1),
                f"{e['bytes'] / 1e6:.2f}",
                f"{smaller:.2f}×" if smaller else "–",
                _num(e.get("parameters")),
                f"{m['peak_rss_bytes'] / 1e6:.0f}" if m.get("peak_rss_bytes") else "–",
                f"{where.get('runtime', '–')}, {where.get('threads', '–')} thr, {where.get('machine', '–')}",
            ]
        )
    header = [
        "model",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "speedup",
        "items/s",
        "MB",
        "smaller",
        "parameters",
        "peak RSS MB",
        "runtime",
    ]
    return _table(header, rows)


PART_NAMES = {"tokenize": "tokenise", "runtime": "runtime call", "postprocess": "post-process"}


def time_table(report: dict[str, Any]) -> list[str]:
    """Where a batch-1 request's time goes, per model that recorded its parts: p50 (mean) ms of the
    tokenisation (text to input arrays), the runtime's own call and the post-processing (softmax,
    argmax, label), and the runtime call's share of the mean request. Empty for a report without
    parts (written before compress timed them)."""
    rows = []
    for e in entries(report):
        latency = e["metrics"].get("latency_ms") or {}
        parts = latency.get("parts")
        if not parts:
            continue
        mean = latency.get("mean")
        runtime_mean = (parts.get("runtime") or {}).get("mean")
        share = f"{100 * runtime_mean / mean:.0f}%" if mean and runtime_mean is not None else "–"
        cells = [
            f"{_num(parts[name].get('p50'), 3)} ({_num(parts[name].get('mean'), 3)})"
            if name in parts
            else "–"
            for name in PART_NAMES
        ]
        rows.append([f"`{e['name']}`", _num(latency.get("p50"), 2), _num(mean, 2), *cells, share])
    if not rows:
        return []
    header = ["model", "request p50", "request mean", *(f"{n} p50 (mean)" for n in PART_NAMES.values())]
    return _table([*header, "runtime share of mean"], rows)


def time_section(report: dict[str, Any]) -> list[str]:
    table = time_table(report)
    if not table:
        return []
    return [
        "## Where the time goes (batch 1, ms)",
        "",
        "Each request timed in three parts; per request they add up to the whole, so the means add up "
        "to the request mean (medians need not).",
        "",
        *table,
        "",
    ]


def class_table(report: dict[str, Any]) -> list[str]:
    labels = report.get("data", {}).get("labels", [])
    rows = []
    for e in entries(report):
        per = e["metrics"].get("per_class") or {}
        rows.append(
            [f"`{e['name']}`"]
            + [
                f"{per[n]['correct']}/{per[n]['support']} (pred {per[n]['predicted']})" if n in per else "–"
                for n in labels
            ]
        )
    return _table(["model", *[f"{n}: correct/support" for n in labels]], rows)


def gate_table(report: dict[str, Any]) -> list[str]:
    rows = [
        [
            g["verdict"].upper(),
            g["gate"],
            f"`{g['artifact']}`",
            _num(g["value"]),
            _num(g["threshold"]),
            g.get("detail") or "",
        ]
        for g in report.get("gates", [])
    ]
    return _table(["verdict", "gate", "artifact", "value", "threshold", "detail"], rows)


def device_table(report: dict[str, Any]) -> list[str]:
    host = {e["name"]: _lat(e, "p50") for e in report.get("artifacts", [])}
    rows = [
        [
            f"`{r['artifact']}`"
            + (f" ({r['model']})" if not str(r.get("model", "model.")).startswith("model.") else ""),
            r["where"],
            f"{r.get('board') or r.get('cpu') or '–'} ({r.get('machine')})",
            f"{r['runtime']}, {r.get('threads')} thr",
            _num(r["latency_ms"].get("p50"), 2),
            _num(r["latency_ms"].get("p90"), 2),
            _num(r["latency_ms"].get("p99"), 2),
            _num(host.get(r["artifact"]), 2),
        ]
        for r in report.get("device_results", [])
    ]
    return _table(
        ["artifact", "where", "device", "runtime", "p50 ms", "p90 ms", "p99 ms", "host p50 ms"], rows
    )


def fallback_table(report: dict[str, Any]) -> list[str]:
    """Each artifact's fallback models beside its primary: what the primary's compute buys, at what
    agreement (the share of rows where the two give the same label)."""
    rows = []
    for e in report.get("artifacts", []):
        for f in e.get("fallbacks") or []:
            m, primary = f["metrics"], e.get("predictions")
            same = (
                sum(a == b for a, b in zip(primary, f["predictions"], strict=True)) / len(primary)
                if primary and f.get("predictions") and len(primary) == len(f["predictions"])
                else None
            )
            speed = _ratio(_lat(f, "p50"), _lat(e, "p50"))
            rows.append(
                [
                    f"`{e['name']}` ({f['path']})",
                    f"{f.get('interpreter') or '–'} < {f.get('below') or '–'}",
                    f.get("scheme") or "–",
                    _num(m.get("accuracy")),
                    _num(m.get("agreement")),
                    _num(same),
                    _num(_lat(f, "p50"), 2),
                    _num(_lat(e, "p50"), 2),
                    f"{speed:.2f}×" if speed else "–",
                    f"{f['bytes'] / 1e6:.2f}" if f.get("bytes") is not None else "–",
                ]
            )
    header = [
        "fallback model",
        "for",
        "scheme",
        "accuracy",
        "agreement",
        "same label as primary",
        "p50 ms",
        "primary p50 ms",
        "fallback p50 ÷ primary p50",
        "MB",
    ]
    return _table(header, rows) if rows else []


def markdown(report: dict[str, Any]) -> str:
    data, host = report.get("data", {}), report.get("host", {})
    teacher = report.get("teacher") or {}
    lat = (teacher.get("metrics") or {}).get("latency_ms") or {}
    lines = [
        f"# compress report: {report.get('recipe', '')}",
        "",
        f"Data: `{data.get('source')}` ({data.get('rows')} rows, split `{report.get('split')}`, sha256 "
        f"`{str(data.get('sha256'))[:12]}`). Every model ran on host {host.get('machine')} "
        f"({host.get('cpus')} CPUs) "
        f"in its own process, through its own runtime and saved tokenizer. Latency: batch 1 over real eval "
        "sentences, from text to label (tokenisation and post-processing included), after "
        f"{lat.get('warmup', '–')} warm-up requests; fixed-length artifacts pad to their length. "
        "Deltas and ratios are against the teacher.",
        "",
        "## Quality and fidelity to the teacher",
        "",
        *quality_table(report),
        "",
        *interval_note(report),
        "## Cost",
        "",
        *cost_table(report),
        "",
        *time_section(report),
        "## Per-class counts",
        "",
        *class_table(report),
        "",
    ]
    fallbacks = fallback_table(report)
    if fallbacks:
        lines += [
            "## Fallback models",
            "",
            "Each runs on an interpreter that computes its artifact's primary model wrongly; measured "
            "here on the host's interpreter like the primary.",
            "",
            *fallbacks,
            "",
        ]
    if report.get("device_results"):
        lines += ["## Measured on device", "", *device_table(report), ""]
    if report.get("gates"):
        verdict = "all passed" if report.get("passed") else "FAILED"
        lines += [f"## Gates: {verdict}", "", *gate_table(report), ""]
    lines += [f"![accuracy vs p50 latency]({REPORT_PLOT})", ""]
    return "\n".join(lines)


def figure(report: dict[str, Any]) -> Any:
    """Accuracy against p50 latency, marker area proportional to model bytes, every point named.

    Models often sit on nearly the same spot; ``place_labels`` keeps their names apart.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from compress.plot_labels import Point, place_labels

    points = [e for e in entries(report) if e["metrics"].get("accuracy") is not None and _lat(e, "p50")]
    largest = max((e["bytes"] for e in points), default=1) or 1
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    labels = []
    for e in points:
        color = {"teacher": "tab:red", "checkpoint": "tab:orange"}.get(e["role"], "tab:blue")
        x, y, size = _lat(e, "p50"), e["metrics"]["accuracy"], 60 + 1500 * e["bytes"] / largest
        ax.scatter([x], [y], s=size, alpha=0.45, color=color, edgecolors="black", zorder=2)
        labels.append(Point(x, y, f"{e['name']}\n{e['bytes'] / 1e6:.1f} MB", size**0.5 / 2))
    latencies = [_lat(e, "p50") for e in points]
    if latencies and max(latencies) / min(latencies) > 20:
        ax.set_xscale("log")
    ax.set_xlabel(f"p50 latency, batch 1 (ms, host {report.get('host', {}).get('machine', '')})")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{report.get('recipe', '')}: accuracy vs latency (marker area ∝ model bytes)")
    ax.margins(x=0.2, y=0.2)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    ax.set_xlim(ax.get_xlim())  # the labels are placed in pixels: the scale must not move afterwards
    ax.set_ylim(ax.get_ylim())
    place_labels(ax, labels, fontsize=8, zorder=3)
    return fig


def plot(report: dict[str, Any], path: str | Path) -> None:
    """Draw ``figure(report)`` into a PNG at ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(report)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
