"""Measure one model in a process of its own: ``python -m compress.evaluate_worker REQUEST.json RESULT.json``.

A fresh process per model makes the peak memory honest (it covers only this model and its
runtime, never the teacher evaluated before it) and keeps torch out of the process that measures
an ONNX or TFLite artifact, as on a device. Artifacts run through ``compress.runtime.runner``, the
same code that ships in a deploy bundle; checkpoints through ``compress.models.load_classifier``.
"""

from __future__ import annotations

import json
import platform
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from compress.metrics import latency_summary

Predict = Callable[[list[str], "list[str] | None"], np.ndarray]


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
) -> tuple[Predict, dict[str, Any]]:
    """A checkpoint as a predict function; tokenising is part of each call, as it is on a device."""
    import torch

    from compress.models import count_parameters, load_classifier
    from compress.training import forward_inputs

    torch.set_num_threads(threads)
    # share-stage checkpoints come back with their ties; pickle or remote code only if the recipe opted in
    model, tokenizer = load_classifier(path, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)

    @torch.inference_mode()
    def predict(texts: list[str], pairs: list[str] | None) -> np.ndarray:
        enc = tokenizer(
            texts, pairs, truncation=True, max_length=max_length, padding="longest", return_tensors="pt"
        )
        return model(**forward_inputs(model, dict(enc))).logits.float().numpy()

    info = {
        "runtime": f"torch {torch.__version__}",
        "parameters": count_parameters(model),
        "max_length": max_length,
    }
    return predict, info


def load_artifact(path: str, threads: int) -> tuple[Predict, dict[str, Any]]:
    """An artifact through the bundle runner; a fixed-length model pads every input to its length."""
    from compress.errors import ModelError
    from compress.runtime.runner import RunnerError, load

    try:
        runner = load(path, threads=threads)
    except RunnerError as exc:
        raise ModelError(str(exc)) from None
    session = runner.session

    def predict(texts: list[str], pairs: list[str] | None) -> np.ndarray:
        return runner.predict_logits(texts, pairs, batch_size=len(texts))

    info = {
        "runtime": f"{session.interpreter} {session.interpreter_version}",
        "max_length": runner.encoder.max_length,
        "padded_to": session.lengths,
        "runtime_batch": session.fixed_batch,
    }
    return predict, info


def _pairs_at(pairs: list[str] | None, start: int, stop: int) -> list[str] | None:
    return pairs[start:stop] if pairs is not None else None


def measure(predict: Predict, request: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
    """Warm up, time batch-1 requests over real eval sentences, then predict everything in batches.

    The batched pass gives both the logits for the quality metrics and the throughput, so the data
    is run once, after warm-up.
    """
    texts, pairs = request["texts"], request["pairs"]
    n = len(texts)
    for i in range(request["warmup"]):
        predict([texts[i % n]], _pairs_at(pairs, i % n, i % n + 1))
    timings = []
    for i in range(request["latency_samples"]):
        j = i % n
        start = time.perf_counter()
        predict([texts[j]], _pairs_at(pairs, j, j + 1))
        timings.append(time.perf_counter() - start)
    size = request["batch_size"]
    batches, start = [], time.perf_counter()
    for lo in range(0, n, size):
        batches.append(
            np.asarray(predict(texts[lo : lo + size], _pairs_at(pairs, lo, lo + size)), dtype=np.float32)
        )
    elapsed = time.perf_counter() - start
    stats = {
        "latency_ms": latency_summary(timings),
        "throughput": {"batch_size": size, "items_per_s": n / elapsed if elapsed > 0 else None},
    }
    return np.concatenate(batches), stats


def load_model(request: dict[str, Any]) -> tuple[Predict, dict[str, Any]]:
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
        return load_artifact(request["model"], threads)
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
    predict, info = load_model(request)
    logits, stats = measure(predict, request)
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
