"""Labels beside scatter points that never overlap one another, a marker, a leader line or the frame.

Models of one run often sit on nearly the same spot (equal accuracy, similar latency), so a fixed
offset stacks their names on top of each other. Instead, measured with the renderer's text extents:

- markers that overlap form a cluster, labelled by one column beside it, top to bottom in the
  order of the points, each name joined to its marker's centre by a thin line;
- any other point takes the first free spot in a fixed list around it, nearest first, with a line
  to its marker when the spot is not next to it.

Nothing is random: the same report always draws the same picture.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

GAP_PT = 3.0
"""Space between a marker's edge and its label."""
STEP_PT = 8.0
"""How much further out each ring of candidate spots lies."""
RINGS = 60
ANGLES_DEG = (20, -20, 0, 45, -45, 160, 200, 180, 90, 270, 135, 225)
"""Directions tried at each distance, right of the point first (where a reader looks for a name)."""
PAD_PX = 2.0
"""Minimum clearance between a label and anything else, in pixels."""
SHIFT_PX = 4.0
"""Step by which a cluster's column moves up or down until it fits."""

Circle = tuple[float, float, float]
"""A marker in display pixels: centre x, centre y, radius."""


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    label: str
    radius_pt: float
    """Half the marker's diameter in points (a scatter marker of size ``s`` is ``sqrt(s)`` across)."""


@dataclass(frozen=True)
class Spot:
    dx: float
    """Offset of the text's anchor from the point, in points."""
    dy: float
    ha: str
    va: str


def candidates(radius_pt: float) -> Iterator[Spot]:
    """Spots nearest first, each aligned so that its text extends away from the point."""
    for ring in range(RINGS):
        distance = radius_pt + GAP_PT + ring * STEP_PT
        for angle in ANGLES_DEG:
            dx, dy = math.cos(math.radians(angle)), math.sin(math.radians(angle))
            ha = "left" if dx > 0.3 else "right" if dx < -0.3 else "center"
            va = "bottom" if dy > 0.5 else "top" if dy < -0.5 else "center"
            yield Spot(distance * dx, distance * dy, ha, va)


def place_labels(ax: Any, points: Sequence[Point], **text: Any) -> list[Any]:
    """Label every point on ``ax`` (its limits and layout final) and return the text artists.

    A label stays inside the axes, clear of every marker and leader line, when it can; when the axes
    are full it may cover a marker or a line, and then leave the axes, but never another label.
    """
    canvas = _Canvas(ax, points)
    labels = []
    crowded: list[str] = []
    for p in points:
        label = ax.annotate(p.label, (p.x, p.y), textcoords="offset points", xytext=(0, 0), **text)
        label.set_horizontalalignment("left")
        label.set_verticalalignment("bottom")
        labels.append(label)
    sizes = [(box.width, box.height) for box in (t.get_window_extent(canvas.renderer) for t in labels)]
    for group in canvas.clusters():
        column = canvas.column(group, sizes) if len(group) > 1 else None
        if column is not None:
            for index, (spot, leader) in zip(group, column, strict=True):
                canvas.put(labels[index], spot, leader)
            continue
        for index in group:  # one at a time: each label sees the ones placed before it
            found = canvas.nearest(index, *sizes[index], to_centre=len(group) > 1)
            if found is None:  # a full figure: the label goes beside its marker rather than fail the report
                crowded.append(points[index].label)
                found = (Spot(GAP_PT, GAP_PT, "left", "bottom"), None)
            canvas.put(labels[index], *found)
    if crowded:
        log.warning(
            "report plot: no free room for %d label(s) (%s); they sit beside their markers and may overlap",
            len(crowded),
            ", ".join(crowded[:3]) + (", ..." if len(crowded) > 3 else ""),
        )
    return labels


class _Canvas:
    """What is drawn so far, in display pixels: markers, placed labels and leader lines."""

    def __init__(self, ax: Any, points: Sequence[Point]) -> None:
        fig = ax.figure
        self.ax = ax
        self.renderer = fig.canvas.get_renderer()
        self.px_per_pt = fig.dpi / 72
        self.points = points
        self.markers: list[Circle] = [
            (*ax.transData.transform((p.x, p.y)), p.radius_pt * self.px_per_pt) for p in points
        ]
        self.inside = ax.get_window_extent(self.renderer)
        self.frames = ((self.inside, True), (self.inside, False), (fig.bbox, False))
        self.labels: list[Any] = []
        self.leaders: list[Any] = []

    def clusters(self) -> list[list[int]]:
        """Groups of markers that overlap, directly or through others, each top to bottom then left
        to right; groups of several first (they are the hard ones), then single points as given."""
        groups: list[list[int]] = []
        seen: set[int] = set()
        for start in range(len(self.markers)):
            if start in seen:
                continue
            group, todo = {start}, [start]
            while todo:
                a = self.markers[todo.pop()]
                for i, b in enumerate(self.markers):
                    if i not in group and _touch(a, b):
                        group.add(i)
                        todo.append(i)
            seen |= group
            groups.append(sorted(group, key=lambda i: (-self.markers[i][1], self.markers[i][0])))
        return sorted(groups, key=lambda g: len(g) == 1)

    def column(self, group: list[int], sizes: list[tuple[float, float]]) -> list[tuple[Spot, Any]] | None:
        """One column of labels beside the cluster, in the group's order, each with a line from its
        marker's centre: right of the cluster, else left, moved up or down until it fits, clear of
        markers and lines if it can be; None if it fits nowhere inside the axes."""
        members = [self.markers[i] for i in group]
        total = sum(sizes[i][1] for i in group) + 2 * PAD_PX * (len(group) - 1)
        middle = sum(y for _, y, _ in members) / len(members)
        gap = GAP_PT * self.px_per_pt
        sides = (
            (max(x + r for x, _, r in members) + gap, "left"),
            (min(x - r for x, _, r in members) - gap, "right"),
        )
        shifts = range(2 * int(self.inside.height / SHIFT_PX) + 1)
        for strict in (True, False):
            for edge, ha in sides:
                for step in shifts:
                    top = middle + total / 2 + (step + 1) // 2 * SHIFT_PX * (1 if step % 2 else -1)
                    placed = self._column_at(group, sizes, edge, ha, top, strict)
                    if placed is not None:
                        return placed
        return None

    def _column_at(
        self,
        group: list[int],
        sizes: list[tuple[float, float]],
        edge: float,
        ha: str,
        top: float,
        strict: bool,
    ) -> list[tuple[Spot, Any]] | None:
        """The column whose labels hang from ``top`` with their ``ha`` side on ``edge``, if it is free."""
        from matplotlib.transforms import Bbox

        out: list[tuple[Spot, Any]] = []
        boxes: list[Any] = []
        for index in group:
            x, y, r = self.markers[index]
            width, height = sizes[index]
            box = Bbox.from_bounds(edge - (width if ha == "right" else 0), top - height, width, height)
            top -= height + 2 * PAD_PX
            anchor = (edge, box.y0 + height / 2)
            leader = _line((x, y, r), anchor, to_centre=True)
            if not _inside(box, self.inside) or not self.free(box, leader, strict=strict, also=boxes):
                return None
            offset = ((anchor[0] - x) / self.px_per_pt, (anchor[1] - y) / self.px_per_pt)
            out.append((Spot(*offset, ha, "center"), leader))
            boxes.append(box)
        return out

    def nearest(self, index: int, width: float, height: float, *, to_centre: bool) -> tuple[Spot, Any] | None:
        """The nearest free spot for a ``width`` × ``height`` label of point ``index``, and its leader
        line (None when the label sits next to its point and its marker overlaps no other)."""
        from matplotlib.transforms import Bbox

        point, (x, y, r) = self.points[index], self.markers[index]
        near = point.radius_pt + GAP_PT + STEP_PT / 2
        for frame, strict in self.frames:
            for spot in candidates(point.radius_pt):
                tx, ty = x + spot.dx * self.px_per_pt, y + spot.dy * self.px_per_pt
                x0 = tx - {"left": 0, "center": width / 2, "right": width}[spot.ha]
                y0 = ty - {"bottom": 0, "center": height / 2, "top": height}[spot.va]
                box = Bbox.from_bounds(x0, y0, width, height)
                if not _inside(box, frame):
                    continue
                far = to_centre or math.hypot(spot.dx, spot.dy) > near
                leader = _line((x, y, r), (tx, ty), to_centre=to_centre) if far else None
                if self.free(box, leader, strict=strict):
                    return spot, leader
        return None

    def free(self, box: Any, leader: Any | None, *, strict: bool, also: Sequence[Any] = ()) -> bool:
        """No label ever overlaps another (placed, or ``also`` about to be); ``strict`` also keeps it
        off markers and leader lines, and its own leader line off other labels."""
        padded = box.padded(PAD_PX)
        labels = [*self.labels, *also]
        if any(padded.overlaps(other) for other in labels):
            return False
        if not strict:
            return True
        if any(_hits(marker, padded) for marker in self.markers):
            return False
        if any(line.intersects_bbox(padded, filled=False) for line in self.leaders):
            return False
        return leader is None or not any(leader.intersects_bbox(other, filled=False) for other in labels)

    def put(self, label: Any, spot: Spot, leader: Any | None) -> None:
        label.xyann = (spot.dx, spot.dy)
        label.set_horizontalalignment(spot.ha)
        label.set_verticalalignment(spot.va)
        self.labels.append(label.get_window_extent(self.renderer))
        if leader is not None:
            self.leaders.append(leader)
            xs, ys = self.ax.transData.inverted().transform(leader.vertices).T
            self.ax.plot(xs, ys, color="0.4", lw=0.6, zorder=2.5)


def _inside(box: Any, frame: Any) -> bool:
    return frame.x0 <= box.x0 and frame.y0 <= box.y0 and box.x1 <= frame.x1 and box.y1 <= frame.y1


def _hits(marker: Circle, box: Any) -> bool:
    x, y, r = marker
    return math.hypot(x - min(max(x, box.x0), box.x1), y - min(max(y, box.y0), box.y1)) < r + PAD_PX


def _touch(a: Circle, b: Circle) -> bool:
    return math.hypot(a[0] - b[0], a[1] - b[1]) < a[2] + b[2]


def _line(marker: Circle, anchor: tuple[float, float], *, to_centre: bool) -> Any:
    """From the marker's edge (or centre) almost to the label's anchor, in pixels."""
    from matplotlib.path import Path

    x, y, r = marker
    dx, dy = anchor[0] - x, anchor[1] - y
    start = 0.0 if to_centre else r / math.hypot(dx, dy)
    return Path([(x + dx * start, y + dy * start), (x + dx * 0.97, y + dy * 0.97)])
