"""Latency in interleaved rounds: the order rows are measured in, the median and spread of their
rounds, how results.md shows them, and one real run of the server processes on a tiny model.

Fake servers return made-up per-round numbers, so the aggregation is checked exactly; no test
depends on how fast this machine is.
"""

from __future__ import annotations

import itertools
import json
from contextlib import contextmanager
from pathlib import Path

import pytest

from benchmarks import render, rounds, suite
from compress.metrics import latency_parts, latency_summary


class FakeServer:
    """Answers each latency pass with the next of its made-up summaries, logging who was asked."""

    def __init__(self, name: str, p50s: list[float], log: list[str], parts: bool = True):
        self.name, self.p50s, self.log, self.parts = name, list(p50s), log, parts

    def latency(self, warmup: int, samples: int, start: int = 0) -> dict:
        self.log.append(self.name)
        p50 = self.p50s.pop(0)
        summary = {"p50": p50, "p90": 2 * p50, "mean": p50 + 0.1, "samples": samples, "p99": 3 * p50}
        if self.parts:
            summary["parts"] = {
                "tokenize": {"p50": p50 / 10, "mean": p50 / 10},
                "runtime": {"p50": p50 * 0.8, "mean": p50 * 0.8},
                "postprocess": {"p50": p50 / 100, "mean": p50 / 100},
            }
        return summary


def test_rounds_alternate_direction():
    assert [rounds.round_order(3, i) for i in range(4)] == [[0, 1, 2], [2, 1, 0], [0, 1, 2], [2, 1, 0]]


def test_each_round_measures_every_row_in_turn():
    log: list[str] = []
    servers = [FakeServer(name, [1.0, 2.0, 3.0], log) for name in "abc"]
    results, orders = rounds.interleave(servers, rounds=3, warmup=1, samples=5)
    assert log == list("abc" + "cba" + "abc")
    assert orders == [[0, 1, 2], [2, 1, 0], [0, 1, 2]]
    assert [[r["p50"] for r in per_server] for per_server in results] == [[1.0, 2.0, 3.0]] * 3


class SliceServer:
    """Times request i as ``scale * (i + 1)`` ms and hands back every request's seconds, logging each ask."""

    def __init__(self, name: str, scale: float, log: list[tuple]):
        self.name, self.scale, self.log = name, scale, log

    def latency(self, warmup: int, samples: int, start: int = 0) -> dict:
        self.log.append((self.name, warmup, start, samples))
        seconds = [self.scale * (i + 1) / 1000 for i in range(start, start + samples)]
        summary = latency_summary(seconds)
        summary["seconds"] = seconds
        summary["part_seconds"] = {"runtime": [t / 2 for t in seconds], "tokenize": [t / 2 for t in seconds]}
        summary["parts"] = latency_parts(summary["part_seconds"])
        return summary


def test_slices_cover_every_request_once_in_near_equal_parts():
    assert rounds.slice_bounds(10, 3) == [(0, 3), (3, 3), (6, 4)]
    assert rounds.slice_bounds(4, 16) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert rounds.slice_bounds(7, 1) == [(0, 7)]
    for samples, slices in [(872, 16), (408, 16), (5, 2)]:
        bounds = rounds.slice_bounds(samples, slices)
        assert sum(count for _, count in bounds) == samples
        assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(bounds))
        assert max(n for _, n in bounds) - min(n for _, n in bounds) <= 1


def test_a_round_of_slices_takes_turns_and_pools_the_requests_as_one_pass():
    log: list[tuple] = []
    servers = [SliceServer("a", 1.0, log), SliceServer("b", 3.0, log)]
    results, orders = rounds.interleave(servers, rounds=2, warmup=10, samples=6, slices=3, rewarm=2)
    assert orders == [[0, 1], [1, 0]] * 3
    assert [entry[0] for entry in log] == list("abbaabbaabba")
    assert log[:4] == [("a", 10, 0, 2), ("b", 10, 0, 2), ("b", 2, 2, 2), ("a", 2, 2, 2)]
    for server, per_round in zip(servers, results, strict=True):
        whole = latency_summary([server.scale * (i + 1) / 1000 for i in range(6)])
        assert len(per_round) == 2
        for summary in per_round:
            assert "seconds" not in summary and summary["samples"] == 6
            assert (summary["p50"], summary["p90"]) == pytest.approx((whole["p50"], whole["p90"]))
            assert summary["parts"]["runtime"]["p50"] == pytest.approx(whole["p50"] / 2)


def test_one_slice_per_round_is_one_pass_per_row():
    log: list[tuple] = []
    results, orders = rounds.interleave([SliceServer("a", 1.0, log)], rounds=2, warmup=4, samples=3)
    assert log == [("a", 4, 0, 3), ("a", 2, 0, 3)] and orders == [[0], [0]]
    assert "seconds" not in results[0][0] and results[0][0]["p50"] == pytest.approx(2.0)


def test_a_rows_p50_is_the_median_of_its_rounds_with_their_min_and_max():
    per_round = [
        {"p50": 3.0, "p90": 9.0, "mean": 3.5, "samples": 10},
        {"p50": 1.0, "p90": 4.0, "mean": 1.5, "samples": 10},
        {"p50": 2.0, "p90": 5.0, "mean": 2.5, "samples": 10},
    ]
    out = rounds.aggregate(per_round)
    assert (out["p50_ms"], out["p50_min_ms"], out["p50_max_ms"], out["p90_ms"]) == (2.0, 1.0, 3.0, 5.0)
    assert out["rounds"] == 3 and [r["p50"] for r in out["per_round"]] == [3.0, 1.0, 2.0]
    assert out["parts_ms"] is None
    two = rounds.aggregate(per_round[:2])
    assert two["p50_ms"] == 2.0  # an even count: the mean of the middle two
    with pytest.raises(ValueError, match="no rounds"):
        rounds.aggregate([])


def _row(name: str, p50: float, fmt: str = "onnx", label: str = "teacher, ORT dynamic int8") -> dict:
    return {
        "row": f"{name} · {fmt}",
        "label": label,
        "format": fmt,
        "p50_ms": p50,
        "p90_ms": 2 * p50,
        "floor_ms": 0.5,
        "x_floor": p50 / 0.5,
        "entry": {
            "path": f"/models/{name}",
            "format": fmt,
            "measured": {"threads": 2},
            "metrics": {"latency_ms": {"p50": p50}},
        },
    }


def test_measure_rounds_replaces_the_single_pass_p50_and_keeps_the_evaluation_entry():
    log: list[str] = []
    made = {
        "/models/a": FakeServer("a", [4.0, 2.0, 3.0], log),
        "/models/b": FakeServer("b", [1.0, 1.2, 0.8], log, parts=False),
    }
    asked: list[dict] = []

    @contextmanager
    def start(requests: list[dict]):
        asked.extend(requests)
        yield [made[r["model"]] for r in requests]

    table = [_row("a", 10.0), _row("b", 5.0, fmt="torch", label="teacher")]
    orders = rounds.measure_rounds(table, ["x", "y"], None, 3, 2, 7, start=start)
    assert orders == [[0, 1], [1, 0], [0, 1]]
    assert [r["kind"] for r in asked] == ["artifact", "torch"] and asked[0]["texts"] == ["x", "y"]
    a, b = table
    assert (a["p50_ms"], a["rounds"]["p50_min_ms"], a["rounds"]["p50_max_ms"]) == (3.0, 2.0, 4.0)
    assert a["x_floor"] == pytest.approx(6.0) and a["p90_ms"] == 6.0
    assert a["entry"]["metrics"]["latency_ms"]["p50"] == 10.0
    assert a["rounds"]["turn"] == [0, 1, 0] and b["rounds"]["turn"] == [1, 0, 1]
    assert a["rounds"]["parts_ms"] == pytest.approx({"tokenize": 0.3, "runtime": 2.4, "postprocess": 0.03})
    assert b["rounds"]["parts_ms"] is None and b["p50_ms"] == 1.0


def test_results_md_shows_the_spread_of_the_rounds_and_where_the_time_goes():
    baseline, headline = _row("ort", 2.0), _row("mine", 1.0, label="distil 6→3 + share + int8")
    rounds.apply(
        baseline, rounds.aggregate([FakeServer("o", [p], []).latency(0, 5) for p in (2.2, 2.0, 1.9)])
    )
    rounds.apply(
        headline, rounds.aggregate([FakeServer("m", [p], []).latency(0, 5) for p in (1.0, 1.1, 0.9)])
    )
    lines = render.time_table([baseline, headline])
    mine = next(line for line in lines if line.startswith("| mine"))
    assert mine == "| mine · onnx | 1.00 | 0.100 | 0.800 | 0.010 | 80% | 0.50 |"
    assert render.p50_cell(headline) == "1.00 [0.90–1.10]"
    note = render.rounds_note([baseline, headline])[1]
    assert "median over 3 interleaved rounds (every row in turn," in note
    baseline["rounds"]["slices"] = headline["rounds"]["slices"] = 16
    assert "3 interleaved rounds (each cut into 16 turns" in render.rounds_note([baseline, headline])[1]


def test_results_without_rounds_or_parts_render_as_before():
    old = _row("ort", 2.0)
    assert render.p50_cell(old) == "2.00"
    assert render.rounds_note([old]) == []
    assert render.time_table([old]) == []


def test_round_fields_carry_no_machine_paths():
    row = _row("a", 1.0)
    rounds.apply(row, {**rounds.aggregate([FakeServer("a", [1.0], []).latency(0, 5)]), "turn": [0]})
    row["entry"]["path"] = f"{suite.REPO}/runs/benchmarks/sst2/peers/a"
    out = suite.portable({"rows": [row]}, [suite.REPO])
    assert str(suite.REPO) not in json.dumps(out)
    assert out["rows"][0]["entry"]["path"] == "runs/benchmarks/sst2/peers/a"
    assert out["rows"][0]["rounds"] == row["rounds"]


@pytest.mark.slow
def test_server_processes_time_a_real_model_in_rounds(tiny_bert_dir: Path):
    table = [_row("tiny", 1.0, fmt="torch", label="teacher"), _row("tiny-again", 1.0, fmt="torch")]
    for row in table:
        row["entry"].update(path=str(tiny_bert_dir), max_length=32)
    texts = ["a short sentence", "another one, a little longer than the first"]
    rounds.measure_rounds(table, texts, None, rounds=2, warmup=1, samples=3, slices=2)
    for row in table:
        summary = row["rounds"]
        assert summary["rounds"] == 2 and [r["samples"] for r in summary["per_round"]] == [3, 3]
        assert summary["slices"] == 2 and len(summary["turn"]) == 4
        per_round = sorted(r["p50"] for r in summary["per_round"])
        assert (summary["p50_min_ms"], summary["p50_max_ms"]) == (per_round[0], per_round[-1])
        assert set(summary["parts_ms"]) == {"tokenize", "runtime", "postprocess"}
        assert all(value >= 0 for value in summary["parts_ms"].values())


def test_the_suite_takes_three_rounds_by_default_and_refuses_none():
    assert suite.parse_args(["--shared", "s"]).rounds == 3
    assert suite.parse_args(["--shared", "s"]).slices == 16
    with pytest.raises(SystemExit):
        suite.parse_args(["--shared", "s", "--slices", "0"])
    assert suite.parse_args(["--shared", "s", "--rounds", "5"]).rounds == 5
    with pytest.raises(SystemExit):
        suite.parse_args(["--shared", "s", "--rounds", "0"])
