"""The paired bootstrap interval of the accuracy kept: cases whose answer is known in advance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from compress.metrics import paired_accuracy_interval, pooled_accuracy_interval


def _noisy(rng: np.random.Generator, truth: np.ndarray, right: float) -> np.ndarray:
    """Predictions that equal ``truth`` on about a share ``right`` of the rows (two labels)."""
    return np.where(rng.random(len(truth)) < right, truth, 1 - truth)


def _k_more(n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gold labels, a teacher right on the first half of the rows, and a model right on those and on
    exactly ``k`` more: the model's accuracy is the teacher's plus k/n on every set of rows."""
    gold = np.arange(n) % 2
    teacher = np.where(np.arange(n) < n // 2, gold, 1 - gold)
    model = np.where(np.arange(n) < n // 2 + k, gold, 1 - gold)
    return gold, teacher, model


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_interval_contains_the_point_estimate(seed: int):
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 2, 500)
    teacher = _noisy(rng, gold, 0.9)
    model = _noisy(rng, teacher, 0.93)
    out = paired_accuracy_interval(model, teacher, gold, seed=seed)
    acc, ref = (model == gold).mean(), (teacher == gold).mean()
    diff, ratio = out["diff_points"], out["ratio"]
    assert diff["estimate"] == pytest.approx(100 * (acc - ref))
    assert ratio["estimate"] == pytest.approx(acc / ref)
    assert diff["low"] < diff["estimate"] < diff["high"]
    assert ratio["low"] < ratio["estimate"] < ratio["high"]
    assert (out["rows"], out["resamples"], out["confidence"], out["seed"]) == (500, 2000, 0.95, seed)


def test_identical_predictions_keep_exactly_all_of_the_accuracy():
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 3, 300)
    teacher = np.where(rng.random(300) < 0.8, gold, (gold + 1) % 3)
    out = paired_accuracy_interval(teacher.tolist(), teacher.tolist(), gold.tolist())
    assert out["diff_points"] == {"estimate": 0.0, "low": 0.0, "high": 0.0}
    assert out["ratio"] == {"estimate": 1.0, "low": 1.0, "high": 1.0}


def test_k_more_right_rows_centre_on_k_over_n_and_narrow_as_n_grows():
    widths = []
    for n in (200, 800, 3200):
        k = n // 20  # the model is right on 5% more rows than the teacher
        gold, teacher, model = _k_more(n, k)
        out = paired_accuracy_interval(model, teacher, gold)
        diff, ratio = out["diff_points"], out["ratio"]
        assert diff["estimate"] == pytest.approx(5.0)
        assert diff["low"] < 5.0 < diff["high"]
        assert ratio["low"] < (n // 2 + k) / (n // 2) < ratio["high"]
        # the difference per resample is Binomial(n, k/n) / n: its 95% interval is about ±1.96 sd
        sd = 100 * np.sqrt(0.05 * 0.95 / n)
        assert diff["high"] - diff["low"] == pytest.approx(2 * 1.96 * sd, rel=0.2)
        assert diff["low"] >= 0  # the model is never worse on any resample
        widths.append(diff["high"] - diff["low"])
    assert widths[0] > widths[1] > widths[2]
    assert widths[0] / widths[2] == pytest.approx(4, rel=0.25)  # 16x the rows, 1/4 the width


def _binomial_quantile(n: int, p: float, q: float) -> int:
    """The smallest count x with P(Binomial(n, p) <= x) >= q, summed exactly from the pmf."""
    total = 0.0
    for x in range(n + 1):
        log_pmf = math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1)
        total += math.exp(log_pmf + x * math.log(p) + (n - x) * math.log1p(-p))
        if total >= q:
            return x
    return n


def test_the_95_percent_bounds_are_the_resampled_differences_2_5_and_97_5_percentiles():
    """k more right rows out of n: a resample's difference is exactly Binomial(n, k/n) / n, so the
    bounds must sit at that distribution's 2.5% and 97.5% quantiles, within the Monte Carlo error of
    2,000 resamples (about 1.5 rows here; a 90% interval would be 8 rows off)."""
    n, k = 12800, 640
    gold, teacher, model = _k_more(n, k)
    diff = paired_accuracy_interval(model, teacher, gold)["diff_points"]
    for bound, q in ((diff["low"], 0.025), (diff["high"], 0.975)):
        assert n * bound / 100 == pytest.approx(_binomial_quantile(n, k / n, q), abs=5)


def test_rows_are_resampled_jointly_not_separately():
    """Half the rows are hard for both models: resampled together the difference stays narrow;
    resampled separately (unpaired) it would be as wide as each accuracy's own interval."""
    n = 1000
    gold = np.zeros(n, dtype=int)
    teacher = np.where(np.arange(n) < n // 2, 0, 1)
    model = teacher.copy()
    model[:10] = 1  # wrong on 10 of the teacher's right rows
    out = paired_accuracy_interval(model, teacher, gold)
    unpaired_sd = 100 * np.sqrt(2 * 0.5 * 0.5 / n)
    assert out["diff_points"]["high"] - out["diff_points"]["low"] < unpaired_sd
    assert out["diff_points"]["low"] < -1.0 < out["diff_points"]["high"] <= 0


def test_the_same_seed_gives_the_same_interval_and_another_seed_another():
    rng = np.random.default_rng(5)
    gold = rng.integers(0, 2, 400)
    teacher, model = _noisy(rng, gold, 0.85), _noisy(rng, gold, 0.83)
    first = paired_accuracy_interval(model, teacher, gold, seed=7)
    assert paired_accuracy_interval(model, teacher, gold, seed=7) == first
    assert paired_accuracy_interval(model, teacher, gold, seed=8) != first
    fewer = paired_accuracy_interval(model, teacher, gold, seed=7, resamples=300)
    assert fewer["resamples"] == 300 and fewer != first


def test_many_rows_are_resampled_in_chunks_with_the_same_answer():
    gold, teacher, model = _k_more(6000, 300)
    out = paired_accuracy_interval(model, teacher, gold, resamples=1000)
    assert out["resamples"] == 1000
    assert out["diff_points"]["low"] < 5.0 < out["diff_points"]["high"]


def test_pooling_seeds_resamples_the_shared_rows_once_per_resample():
    rng = np.random.default_rng(3)
    gold = rng.integers(0, 2, 600)
    teacher = _noisy(rng, gold, 0.9)
    model = _noisy(rng, teacher, 0.95)
    single = paired_accuracy_interval(model, teacher, gold)
    # three seeds that predict alike are one seed: the same rows are drawn for all of them
    pooled = pooled_accuracy_interval([model, model, model], teacher, gold)
    assert pooled["diff_points"] == single["diff_points"] and pooled["ratio"] == single["ratio"]
    assert pooled["pooled"] == 3
    other = _noisy(rng, teacher, 0.97)
    both = pooled_accuracy_interval([model, other], teacher, gold)
    mean = ((model == gold).mean() + (other == gold).mean()) / 2 - (teacher == gold).mean()
    assert both["diff_points"]["estimate"] == pytest.approx(100 * mean)
    assert both["diff_points"]["low"] < both["diff_points"]["estimate"] < both["diff_points"]["high"]


def test_a_teacher_right_on_no_row_has_no_ratio():
    gold = np.zeros(50, dtype=int)
    out = paired_accuracy_interval(np.zeros(50, dtype=int), np.ones(50, dtype=int), gold, resamples=50)
    assert out["ratio"] is None and out["diff_points"]["estimate"] == 100.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: paired_accuracy_interval([0, 1], [0, 1, 1], [0, 1, 1]), "the predictions has 2 rows"),
        (lambda: paired_accuracy_interval([], [], []), "no rows"),
        (lambda: paired_accuracy_interval([0], [0], [0], resamples=0), "resamples"),
        (lambda: paired_accuracy_interval([0], [0], [0], confidence=95), "confidence"),
        (lambda: pooled_accuracy_interval([], [0], [0]), "no predictions"),
    ],
)
def test_inputs_that_cannot_be_paired_are_refused(call, message: str):
    with pytest.raises(ValueError, match=message):
        call()
