"""Measure one model in a process of its own: ``python -m compress.evaluate_worker REQUEST.json RESULT.json``.

A fresh process per model makes the peak memory honest (it covers only this model and its
runtime, never the teacher evaluated before it) and keeps torch out of the process that measures
an ONNX or TFLite artifact, as on a device. Artifacts run through ``compress.runtime.runner``, the
same code that ships in a deploy bundle; checkpoints through ``compress.models.load_classifier``.
Each batch-1 request runs from text to label and is timed whole and in its parts (tokenisation, the
runtime call, post-processing), so a report can say where a model's time goes, not only how much.
"""

from __future__ import annotations

import json
import platform
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compress.metrics import latency_parts, latency_summary

Predict = Callable[[list[str], "list[str] | None"], np.ndarray]
PARTS = ("tokenize", "runtime", "postprocess")
"""The steps of one request the report times apart: text to input arrays (tokenizer, truncation,
padding, dtype), the runtime's own call, and logits to a label (softmax, argmax, label name)."""


class Stopwatch:
    """Seconds spent inside one step, summed over calls until ``take`` reads and clears them.

    Used as ``with stopwatch:`` around the step, or ``stopwatch.wrap(call)``."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._start

    def wrap(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self:
                return call(*args, **kwargs)

        return timed

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def decoder(labels: list[str] | None) -> Callable[[np.ndarray], list[dict[str, Any]]]:
    """Logits to what an application uses (label name, or id without names, and its probability),
    as the bundle runner's ``Runner.decode`` does for artifacts."""
    from compress.runtime.runner import softmax

    def decode(logits: np.ndarray) -> list[dict[str, Any]]:
        probabilities = softmax(logits)
        return [
            {"label": labels[i] if labels else int(i), "score": float(row[i])}
            for i, row in zip(probabilities.argmax(axis=1), probabilities, strict=True)
        ]

    return decode


@dataclass(frozen=True)
class Model:
    """A loaded model as a request is served: ``predict`` tokenises and calls the runtime (timing that
    call on ``runtime``), ``decode`` turns its logits into labels."""

    predict: Predict
    decode: Callable[[np.ndarray], Any]
    runtime: Stopwatch | None = None
    """None when the runtime call cannot be timed apart (a plain predict function)."""

    @classmethod
    def plain(cls, predict: Predict) -> Model:
        """A predict function whose steps are not separable: timed whole, decoded to label ids."""
        return cls(predict, decoder(None))


def peak_rss_bytes() -> int:
    """Peak resident memory of this process image.

    Linux's ru_maxrss survives fork+exec, so a worker started from a process holding the teacher
    would report the parent's peak; VmHWM belongs to this image only. Elsewhere ru_maxrss (bytes
    on macOS) is the best available.
    """
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def load_torch(
    path: str, threads: int, max_length: int, *, allow_pickle: bool = False, trust_remote_code: bool = False
) -> tuple[Model, dict[str, Any]]:
    """A checkpoint as a model; tokenising is part of each call, as it is on a device."""
    import torch

    from compress.models import count_parameters, load_classifier
    from compress.training import forward_inputs

    torch.set_num_threads(threads)
    # share-stage checkpoints come back with their ties; pickle or remote code only if the recipe opted in
    model, tokenizer = load_classifier(path, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    runtime = Stopwatch()

    @torch.inference_mode()
    def predict(texts: list[str], pairs: list[str] | None) -> np.ndarray:
        enc = tokenizer(
            texts, pairs, truncation=True, max_length=max_length, padding="longest", return_tensors="pt"
        )
        inputs = forward_inputs(model, dict(enc))
        with runtime:
            return model(**inputs).logits.float().numpy()

    info = {
        "runtime": f"torch {torch.__version__}",
        "parameters": count_parameters(model),
        "max_length": max_length,
    }
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    return Model(predict, decoder(labels), runtime), info


def load_artifact(path: str, threads: int, model: str | None = None) -> tuple[Model, dict[str, Any]]:
    """An artifact through the bundle runner; a fixed-length model pads every input to its length.
    ``model`` names one of its fallback model files (default: the one the installed interpreter picks).

    The runtime call is timed by wrapping the session's ``run`` on this instance: the request still
    goes through the runner's own code, so what is measured is what ships in a bundle."""
    from compress.errors import ModelError
    from compress.runtime.runner import RunnerError, load

    try:
        runner = load(path, threads=threads, model=model)
    except RunnerError as exc:
        raise ModelError(str(exc)) from None
    session = runner.session
    runtime = Stopwatch()
    session.run = runtime.wrap(session.run)

    def predict(texts: list[str], pairs: list[str] | None) -> np.ndarray:
        return runner.predict_logits(texts, pairs, batch_size=len(texts))

    ran = runner.describe()
    info = {
        "model_sha256": ran["model_sha256"],
        "runtime": f"{session.interpreter} {session.interpreter_version}",
        "max_length": runner.encoder.max_length,
        "padded_to": session.lengths,
        "runtime_batch": session.fixed_batch,
    }
    return Model(predict, runner.decode, runtime), info


def _pairs_at(pairs: list[str] | None, start: int, stop: int) -> list[str] | None:
    return pairs[start:stop] if pairs is not None else None


def time_requests(
    model: Model,
    texts: list[str],
    pairs: list[str] | None,
    warmup: int,
    samples: int,
    start: int = 0,
    raw: bool = False,
    keep: dict[int, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Batch-1 requests over the texts in order from ``start`` (wrapping) after ``warmup`` untimed
    ones: the whole request (tokenisation, runtime call, decoding to a label) and, when the runtime
    call is timed apart, its parts. Per request the parts add up to the whole; their p50s need not.
    ``raw`` adds every request's seconds (``seconds``, and ``part_seconds`` per part) so that several
    calls' timings can be pooled. ``keep`` collects each timed row's logits by its index (the first
    request of a row, when the samples wrap), so that scoring need not run those rows again."""
    n = len(texts)
    for i in range(start, start + warmup):
        model.decode(model.predict([texts[i % n]], _pairs_at(pairs, i % n, i % n + 1)))
    if model.runtime is not None:
        model.runtime.take()
    totals: list[float] = []
    parts: dict[str, list[float]] = {name: [] for name in PARTS}
    for i in range(start, start + samples):
        j = i % n
        start = time.perf_counter()
        logits = model.predict([texts[j]], _pairs_at(pairs, j, j + 1))
        middle = time.perf_counter()
        model.decode(logits)
        end = time.perf_counter()
        totals.append(end - start)
        if keep is not None and j not in keep:
            keep[j] = np.asarray(logits, dtype=np.float32)
        if model.runtime is not None:
            runtime = model.runtime.take()
            parts["runtime"].append(runtime)
            parts["tokenize"].append(middle - start - runtime)
            parts["postprocess"].append(end - middle)
    summary: dict[str, Any] = latency_summary(totals)
    if model.runtime is not None:
        summary["parts"] = latency_parts(parts)
    if raw:
        summary["seconds"] = totals
        summary["part_seconds"] = parts if model.runtime is not None else None
    return summary


def measure(model: Model | Predict, request: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
    """Warm up, time batch-1 requests over real eval sentences, score every row, then time a batched pass.

    The quality logits come from one request per row, as a device serves them: in a padded batch an
    int8 model's dynamic activation scale is taken over the whole padded tensor, so a row's label
    can depend on its batch-mates (ORT dynamic int8 changed 3-10 of 500 held-out SST-2 labels
    between batch 32 and batch 1). The batched pass only measures throughput; with a batch size of 1
    the scoring pass is that measurement. The timed requests are batch-1 requests too, so the rows they
    covered keep their logits and only the other rows are run again to be scored (a report over every
    eval row, as the suite's, runs each row once at batch 1, not twice). A plain predict function is
    timed whole (no parts).
    """
    model = model if isinstance(model, Model) else Model.plain(model)
    texts, pairs = request["texts"], request["pairs"]
    n = len(texts)
    kept: dict[int, np.ndarray] = {}
    latency = time_requests(model, texts, pairs, request["warmup"], request["latency_samples"], keep=kept)
    rest, start = [i for i in range(n) if i not in kept], time.perf_counter()
    for i in rest:
        kept[i] = np.asarray(model.predict([texts[i]], _pairs_at(pairs, i, i + 1)), dtype=np.float32)
    # batch-1 throughput: every request of both passes over the time they took
    requests = latency["samples"] + len(rest)
    elapsed = latency["mean"] * latency["samples"] / 1000.0 + time.perf_counter() - start
    logits = np.concatenate([kept[i] for i in range(n)]) if n else np.zeros((0, 0), dtype=np.float32)
    size = request["batch_size"]
    if size != 1:
        start = time.perf_counter()
        for lo in range(0, n, size):
            model.predict(texts[lo : lo + size], _pairs_at(pairs, lo, lo + size))
        requests, elapsed = n, time.perf_counter() - start
    stats = {
        "latency_ms": latency,
        "throughput": {"batch_size": size, "items_per_s": requests / elapsed if elapsed > 0 else None},
        "scored_batch_size": 1,
    }
    return logits, stats


def load_model(request: dict[str, Any]) -> tuple[Model, dict[str, Any]]:
    """The guarded loader: any failure to open the user's model file is one line naming it.

    The loaders raise compress errors for what they know (missing files, pickles, hash mismatches);
    a runtime's own exception while parsing a damaged file (protobuf, flatbuffer, safetensors
    header) is still the file's fault, not a bug, so it becomes a ``ModelError`` too.
    """
    from compress.errors import CompressError, ModelError

    threads = request["threads"]
    try:
        if request["kind"] == "torch":
            return load_torch(
                request["model"],
                threads,
                request["max_length"],
                allow_pickle=request.get("allow_pickle", False),
                trust_remote_code=request.get("trust_remote_code", False),
            )
        return load_artifact(request["model"], threads, request.get("model_file"))
    except (CompressError, TypeError, AttributeError, NameError, AssertionError):
        raise  # compress's own errors and bugs stay what they are, not "the file may be damaged"
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ModelError(
            f"cannot load the model ({type(exc).__name__}: {reason}); the file may be damaged: "
            "copy or export it again"
        ) from None


def run(request: dict[str, Any]) -> dict[str, Any]:
    threads = request["threads"]
    before_load = peak_rss_bytes()
    model, info = load_model(request)
    logits, stats = measure(model, request)
    np.save(request["logits"], logits)
    stats["latency_ms"].update(
        warmup=request["warmup"], threads=threads, padded_to=info.pop("padded_to", None)
    )
    stats["throughput"]["runtime_batch"] = info.pop("runtime_batch", None)
    return {
        **info,
        **stats,
        "peak_rss_bytes": peak_rss_bytes(),
        "rss_before_load_bytes": before_load,
        "machine": platform.machine(),
        "system": platform.system(),
        "python": platform.python_version(),
        "threads": threads,
    }


def main(argv: list[str]) -> int:
    request_path, result_path = argv
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    from compress.errors import CompressError

    try:
        result, status = run(request), 0
    except CompressError as exc:
        result, status = {"error": str(exc)}, 2
    with open(result_path, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
