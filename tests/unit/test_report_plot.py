"""The report plot names every model without one name covering another, however close the points."""

from __future__ import annotations

import itertools
from typing import Any

import pytest


def _entry(name: str, role: str, accuracy: float, p50: float, size: int) -> dict[str, Any]:
    return {
        "name": name,
        "role": role,
        "format": "torch" if role != "artifact" else "onnx",
        "bytes": size,
        "metrics": {"accuracy": accuracy, "latency_ms": {"p50": p50}},
    }


def crowded_report(n: int) -> dict[str, Any]:
    """The teacher and a checkpoint apart, and ``n`` artifacts of different sizes on nearly one spot
    (the default run's plot drew five such names on top of each other)."""
    artifacts = [
        _entry(f"04-quantize/raspberry-pi-4-int8-{i}", "artifact", 0.812 + 1e-5 * i, 2.6 + 0.01 * i, size)
        for i, size in zip(range(n), itertools.cycle((19_400_000, 70_000_000, 17_600_000)), strict=False)
    ]
    return {
        "recipe": "crowded",
        "host": {"machine": "x86_64"},
        "teacher": _entry("teacher", "teacher", 0.820, 12.7, 90_900_000),
        "checkpoints": [_entry("02-distill", "checkpoint", 0.805, 6.6, 69_600_000)],
        "artifacts": artifacts,
    }


@pytest.mark.parametrize("crowd", [5, 12])
def test_labels_never_overlap(crowd: int):
    import matplotlib.pyplot as plt

    from compress.report_render import figure

    fig = figure(crowded_report(crowd))
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        [ax] = fig.axes
        labels = [t for t in ax.texts if t.get_text()]
        assert len(labels) == crowd + 2
        boxes = {t.get_text(): t.get_window_extent(renderer) for t in labels}
        for (a, box_a), (b, box_b) in itertools.combinations(boxes.items(), 2):
            assert not box_a.overlaps(box_b), f"{a!r} overlaps {b!r}"
        frame = fig.bbox
        for name, box in boxes.items():
            inside = frame.x0 <= box.x0 and frame.y0 <= box.y0 and box.x1 <= frame.x1 and box.y1 <= frame.y1
            assert inside, f"{name!r} is cut off by the figure's edge"
    finally:
        plt.close(fig)


def test_the_same_report_draws_the_same_labels():
    import matplotlib.pyplot as plt

    from compress.report_render import figure

    def positions() -> list[tuple[str, tuple[float, float]]]:
        fig = figure(crowded_report(5))
        try:
            return [(t.get_text(), tuple(t.xyann)) for t in fig.axes[0].texts]
        finally:
            plt.close(fig)

    assert positions() == positions()


def test_a_figure_with_no_room_left_still_draws_every_label_and_says_so(caplog):
    """60 names on one spot do not fit: the report is still written, each crowded name beside its
    marker, with one warning (it used to raise after the whole evaluation and leave no report)."""
    import matplotlib.pyplot as plt

    from compress.report_render import figure

    with caplog.at_level("WARNING", logger="compress.plot_labels"):
        fig = figure(crowded_report(60))
    try:
        assert len([t for t in fig.axes[0].texts if t.get_text()]) == 62
    finally:
        plt.close(fig)
    [warning] = [r for r in caplog.records if r.name == "compress.plot_labels"]
    assert "no free room for" in warning.getMessage()
