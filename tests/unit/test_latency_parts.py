"""Each batch-1 request is timed in parts (tokenise, runtime call, post-process) that add up to it.

The clock is replaced by a counter the fake model advances, so the attribution of time to each part
is checked exactly and no test depends on how fast this machine is.
"""

from __future__ import annotations

import numpy as np
import pytest

from compress import evaluate_worker
from compress.evaluate_worker import PARTS, Model, Stopwatch, decoder, measure, time_requests
from compress.report_render import markdown


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(evaluate_worker.time, "perf_counter", fake)
    return fake


def fake_model(clock: FakeClock, tokenize: float, runtime: float, post: float) -> Model:
    """A model whose steps take the given (fake) seconds: tokenising, then the runtime call, then decoding."""
    watch = Stopwatch()

    def run(ids: np.ndarray) -> np.ndarray:
        clock.spend(runtime)
        return np.stack([ids, -ids], axis=1).astype(np.float32)

    timed_run = watch.wrap(run)

    def predict(texts: list[str], pairs: list[str] | None) -> np.ndarray:
        clock.spend(tokenize)
        return timed_run(np.array([len(t) for t in texts], dtype=np.float32))

    def decode(logits: np.ndarray) -> list:
        clock.spend(post)
        return decoder(["a", "b"])(logits)

    return Model(predict, decode, watch)


def test_each_part_of_a_request_is_timed_apart_and_the_parts_add_up(clock: FakeClock):
    model = fake_model(clock, tokenize=0.001, runtime=0.004, post=0.0005)
    summary = time_requests(model, ["one", "three"], None, warmup=3, samples=5)
    parts = summary["parts"]
    assert list(parts) == list(PARTS)
    assert parts["tokenize"]["p50"] == pytest.approx(1.0)
    assert parts["runtime"]["p50"] == pytest.approx(4.0)
    assert parts["postprocess"]["mean"] == pytest.approx(0.5)
    assert summary["p50"] == pytest.approx(5.5)
    assert summary["samples"] == 5
    assert sum(p["mean"] for p in parts.values()) == pytest.approx(summary["mean"])


def test_warm_up_requests_are_not_counted_in_the_runtime_part(clock: FakeClock):
    model = fake_model(clock, tokenize=0.0, runtime=0.002, post=0.0)
    summary = time_requests(model, ["x"], None, warmup=10, samples=1)
    assert summary["parts"]["runtime"]["mean"] == pytest.approx(2.0)


def test_a_slice_starts_where_asked_wraps_and_can_hand_back_every_requests_time(clock: FakeClock):
    seen: list[str] = []

    def predict(texts: list[str], pairs: list[str] | None) -> np.ndarray:
        seen.extend(texts)
        clock.spend(0.001 * len(texts[0]))
        return np.zeros((len(texts), 2), dtype=np.float32)

    model = Model.plain(predict)
    summary = time_requests(model, ["a", "bb", "ccc"], None, warmup=1, samples=3, start=2, raw=True)
    assert seen == ["ccc", "ccc", "a", "bb"]  # the warm-up from the slice's start, then wrapping
    assert summary["seconds"] == pytest.approx([0.003, 0.001, 0.002])
    assert summary["part_seconds"] is None and summary["p50"] == pytest.approx(2.0)
    timed = time_requests(fake_model(clock, 0.001, 0.002, 0.0), ["x", "y"], None, 0, 2, raw=True)
    assert timed["part_seconds"]["runtime"] == pytest.approx([0.002, 0.002])
    assert "seconds" not in time_requests(model, ["a"], None, warmup=0, samples=1)


def test_a_plain_predict_function_is_timed_whole_and_still_decoded(clock: FakeClock):
    def predict(texts: list[str], pairs: list[str] | None) -> np.ndarray:
        clock.spend(0.003)
        return np.zeros((len(texts), 2), dtype=np.float32)

    request = {"texts": ["a", "b", "c"], "pairs": None, "warmup": 1, "latency_samples": 4, "batch_size": 2}
    logits, stats = measure(predict, request)
    assert logits.shape == (3, 2)
    assert "parts" not in stats["latency_ms"]
    assert stats["latency_ms"]["p50"] == pytest.approx(3.0)


def test_the_decoder_gives_each_row_its_label_and_probability():
    rows = decoder(["neg", "pos"])(np.array([[0.0, 2.0], [1.0, -1.0]], dtype=np.float32))
    assert [r["label"] for r in rows] == ["pos", "neg"]
    assert rows[0]["score"] == pytest.approx(1 / (1 + np.exp(-2.0)))
    assert decoder(None)(np.array([[3.0, 0.0]]))[0]["label"] == 0


def _report(parts: dict | None) -> dict:
    latency = {"p50": 2.0, "p90": 2.5, "p99": 3.0, "mean": 2.1, "warmup": 10}
    if parts is not None:
        latency["parts"] = parts
    entry = {
        "name": "04-quantize/arm64-onnx-int8",
        "role": "artifact",
        "format": "onnx",
        "bytes": 1_000_000,
        "metrics": {"accuracy": 0.9, "latency_ms": latency, "throughput": {"items_per_s": 500.0}},
    }
    return {
        "recipe": "r",
        "data": {"labels": ["a", "b"]},
        "teacher": None,
        "checkpoints": [],
        "artifacts": [entry],
    }


def test_the_report_shows_where_each_artifacts_time_goes():
    parts = {
        "tokenize": {"p50": 0.05, "mean": 0.06},
        "runtime": {"p50": 1.9, "mean": 2.0},
        "postprocess": {"p50": 0.01, "mean": 0.04},
    }
    text = markdown(_report(parts))
    assert "## Where the time goes" in text
    line = next(
        row for row in text.splitlines() if row.startswith("| `04-quantize/arm64-onnx-int8` | 2.00 | 2.10")
    )
    assert "0.050 (0.060)" in line and "1.900 (2.000)" in line and "0.010 (0.040)" in line
    assert line.endswith("| 95% |")


def test_a_report_from_before_the_parts_were_timed_has_no_breakdown_section():
    assert "Where the time goes" not in markdown(_report(None))


def test_quality_logits_come_from_one_request_per_row_and_the_batch_only_times_throughput(clock: FakeClock):
    """A dynamic-int8-like model: each row's logits depend on its batch-mates (one scale per batch).
    The logits scored are the ones a device gets, a row at a time; the batched pass sets throughput."""
    calls: list[int] = []

    def predict(texts: list[str], pairs: list[str] | None) -> np.ndarray:
        calls.append(len(texts))
        clock.spend(0.001)
        lengths = np.array([len(t) for t in texts], dtype=np.float32)
        scaled = lengths / lengths.max()  # the batch's largest row sets the scale
        return np.stack([scaled, 1 - scaled], axis=1)

    texts = ["aa", "b", "cccc"]
    request = {"texts": texts, "pairs": None, "warmup": 0, "latency_samples": 1, "batch_size": 3}
    logits, stats = measure(predict, request)
    assert logits[:, 0] == pytest.approx([1.0, 1.0, 1.0])  # alone, every row is its own maximum
    # one timed request (row 0, whose logits are kept), the two other rows scored, one batch of three
    assert calls == [1, 1, 1, 3]
    assert stats["scored_batch_size"] == 1
    assert stats["throughput"] == {"batch_size": 3, "items_per_s": pytest.approx(3 / 0.001)}
    calls.clear()
    _, stats = measure(predict, {**request, "batch_size": 1})
    assert calls == [1, 1, 1]  # at batch 1 the timed and scored requests are the throughput measurement
    assert stats["throughput"] == {"batch_size": 1, "items_per_s": pytest.approx(1 / 0.001)}


def test_rows_the_timed_requests_covered_are_not_run_again_to_be_scored(clock: FakeClock):
    """Latency over every row (the suite's setting): each row runs once at batch 1, and its logits are
    the ones scored, in row order, even when the timed requests start again from the first row."""
    calls: list[str] = []

    def predict(texts: list[str], pairs: list[str] | None) -> np.ndarray:
        calls.extend(texts)
        clock.spend(0.002)
        return np.array([[len(t), -len(t)] for t in texts], dtype=np.float32)

    texts = ["aa", "b", "cccc"]
    for samples in (3, 5):
        calls.clear()
        logits, stats = measure(
            predict, {"texts": texts, "pairs": None, "warmup": 1, "latency_samples": samples, "batch_size": 1}
        )
        assert calls == ["aa", *(texts * 2)[:samples]]  # the warm-up, then the timed requests only
        assert logits[:, 0].tolist() == [2.0, 1.0, 4.0]
        assert stats["latency_ms"]["samples"] == samples
