"""Evaluate the teacher, checkpoints and artifacts on the same data, each through its own runtime.

Every model runs in a fresh worker process (``compress.evaluate_worker``) with its own saved
tokenizer: a checkpoint through PyTorch, an ``.onnx`` through onnxruntime and a ``.tflite``
through LiteRT, via the runner that ships in deploy bundles. The logits come back here, where
task metrics and fidelity to the teacher are computed the same way for all of them. Each entry keeps
the label id it predicts for every row, so that paired statistics against the teacher (the bootstrap
interval of the accuracy kept, computed here too) can be checked and recomputed from the record.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compress.data import Split
from compress.errors import CompressError, DataError
from compress.footprint import artifact_parameters, model_bytes_and_sha, total_bytes
from compress.io import read_json
from compress.metrics import (
    RESAMPLES,
    fidelity_metrics,
    paired_accuracy_interval,
    predicted_ids,
    task_metrics,
)
from compress.subjects import FallbackModel, Subject
from compress.targets import TargetProfile, load_target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    latency_samples: int = 200
    warmup: int = 10
    batch_size: int = 32
    threads: int | None = None
    """Threads for every model; None: the artifact's target profile, ``teacher_threads`` for checkpoints."""
    teacher_threads: int = 2
    max_length: int = 128
    """Truncation for checkpoints (artifacts use the length they were exported with)."""
    bootstrap_resamples: int = RESAMPLES
    """Resamples of the paired bootstrap interval of the accuracy kept (rows resampled jointly)."""

    @classmethod
    def from_recipe(cls, recipe: Any) -> Settings:
        ev = recipe.evaluate
        return cls(
            latency_samples=ev.latency_samples,
            warmup=ev.warmup,
            batch_size=ev.throughput_batch,
            threads=ev.threads,
            max_length=recipe.task.max_length,
        )


def threads_for(profile: TargetProfile | None, settings: Settings) -> int:
    """The thread count to measure with, capped at this machine's cores (oversubscription only adds noise)."""
    wanted = settings.threads or (profile.threads if profile else settings.teacher_threads)
    return max(1, min(wanted, os.cpu_count() or 1))


def killed_line(fmt: str, number: int) -> str:
    """Why an evaluation worker died of a signal, and what to do: a crash inside a native runtime
    (SIGSEGV, SIGBUS, SIGABRT, SIGILL) is typically a damaged model file; SIGKILL is most often the
    kernel's out-of-memory killer; SIGINT/SIGTERM mean someone stopped it."""
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    if name == "SIGKILL":
        return (
            f"the evaluation worker was killed ({name}), most often by the out-of-memory killer; "
            "free memory or lower evaluate.throughput_batch, then run again"
        )
    if name in ("SIGINT", "SIGTERM", "SIGHUP"):
        return f"the evaluation worker was stopped ({name}); run the command again to finish it"
    return (
        f"the {fmt} runtime crashed ({name}) loading or running it; the model file may be damaged: "
        "export it again"
    )


def worker_env(threads: int) -> dict[str, str]:
    """The environment of a process that measures a model: offline, compress importable, one thread
    count for every runtime, and no tokenizer thread pool competing with the model's threads."""
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def run_worker(
    subject: Subject, split: Split, settings: Settings, threads: int, model_file: str | None = None
) -> tuple[np.ndarray, dict[str, Any]]:
    """Run ``subject`` on ``split`` in a fresh process; return its logits and measurements.

    ``model_file`` runs one of an artifact's fallback models instead of the one the host would pick."""
    with tempfile.TemporaryDirectory(prefix="compress-eval-") as tmp:
        request = {
            "model": str(subject.path),
            "model_file": model_file,
            "kind": "torch" if subject.format == "torch" else "artifact",
            "allow_pickle": subject.allow_pickle,
            "trust_remote_code": subject.trust_remote_code,
            "texts": split.texts,
            "pairs": split.pairs,
            "threads": threads,
            "max_length": settings.max_length,
            "warmup": settings.warmup,
            "latency_samples": settings.latency_samples,
            "batch_size": settings.batch_size,
            "logits": f"{tmp}/logits.npy",
        }
        Path(tmp, "request.json").write_text(json.dumps(request))
        proc = subprocess.run(
            [sys.executable, "-m", "compress.evaluate_worker", f"{tmp}/request.json", f"{tmp}/result.json"],
            env=worker_env(threads),
            capture_output=True,
            text=True,
        )
        result = read_json(f"{tmp}/result.json") if Path(tmp, "result.json").is_file() else {}
        where = subject.path / model_file if model_file else subject.path
        if proc.returncode != 0:
            if isinstance(result, dict) and isinstance(result.get("error"), str):
                raise CompressError(f"{where}: {result['error']}")
            if proc.returncode < 0:
                raise CompressError(f"{where}: {killed_line(subject.format, -proc.returncode)}")
            raise RuntimeError(f"evaluating {where} failed:\n{proc.stderr[-4000:]}")
        return np.load(f"{tmp}/logits.npy"), result


def score(
    logits: np.ndarray, split: Split, teacher_logits: np.ndarray | None, resamples: int = RESAMPLES
) -> dict[str, Any]:
    """Task metrics (with gold labels), fidelity to the teacher (with its logits) and, with both, the
    paired bootstrap interval of the accuracy kept (``accuracy_vs_teacher``): one scoring for every row."""
    metrics: dict[str, Any] = {}
    if split.labels is not None:
        metrics.update(task_metrics(logits, split.labels, split.label_names))
    if teacher_logits is not None:
        metrics.update(fidelity_metrics(logits, teacher_logits))
        if split.labels is not None:
            metrics["accuracy_vs_teacher"] = paired_accuracy_interval(
                predicted_ids(logits), predicted_ids(teacher_logits), split.labels, resamples=resamples
            )
    return metrics


def evaluate_subject(
    subject: Subject, split: Split, settings: Settings, teacher_logits: np.ndarray | None = None
) -> tuple[dict[str, Any], np.ndarray]:
    """One report entry (identity, footprint, measurements, metrics) and the subject's logits."""
    log.info("evaluating %s (%s) on %d rows", subject.name, subject.format, len(split))
    profile = load_target(subject.target) if subject.target else None
    logits, run = run_worker(subject, split, settings, threads_for(profile, settings))
    if logits.shape[-1] != len(split.label_names):
        raise DataError(
            f"{subject.path} predicts {logits.shape[-1]} classes but {split.source} has "
            f"{len(split.label_names)} labels {split.label_names}; evaluate it on data for its task"
        )
    size, sha = model_bytes_and_sha(subject.path, subject.format)
    reference = teacher_logits if subject.role != "teacher" else None
    metrics = measured_metrics(logits, run, split, reference, settings)
    params = run.get("parameters") or artifact_parameters(subject.path, subject.format)
    entry = {
        "name": subject.name,
        "role": subject.role,
        "path": str(subject.path),
        "format": subject.format,
        "target": subject.target,
        "precision": subject.precision,
        "bytes": size,
        "total_bytes": total_bytes(subject.path),
        "sha256": sha,
        "parameters": params,
        "max_length": run.get("max_length"),
        "measured": {
            "where": "host",
            "machine": run["machine"],
            "system": run["system"],
            "runtime": run["runtime"],
            "threads": run["threads"],
            "scored_batch_size": run["scored_batch_size"],
        },
        "metrics": metrics,
    }
    if profile is not None:
        entry["budgets"] = {k: v for k, v in profile.budgets.model_dump().items() if v is not None}
    entry["predictions"] = predicted_ids(logits)
    if subject.fallbacks:
        threads = run["threads"]
        entry["fallbacks"] = [
            evaluate_fallback(subject, fallback, split, settings, threads, reference)
            for fallback in subject.fallbacks
        ]
    return entry, logits


RUN_METRICS = ("latency_ms", "throughput", "peak_rss_bytes", "rss_before_load_bytes")


def measured_metrics(
    logits: np.ndarray, run: dict[str, Any], split: Split, reference: np.ndarray | None, settings: Settings
) -> dict[str, Any]:
    metrics = score(logits, split, reference, settings.bootstrap_resamples)
    metrics.update({key: run[key] for key in RUN_METRICS})
    return metrics


def evaluate_fallback(
    subject: Subject,
    fallback: FallbackModel,
    split: Split,
    settings: Settings,
    threads: int,
    reference: np.ndarray | None,
) -> dict[str, Any]:
    """A TFLite artifact's fallback model (e.g. weight-only for tflite-runtime 2.14), measured on the
    host like its primary, so the report shows what the primary's int8 compute buys against it."""
    log.info("evaluating %s's %s (%s) on %d rows", subject.name, fallback.path, subject.format, len(split))
    logits, run = run_worker(subject, split, settings, threads, model_file=fallback.path)
    return {
        "path": fallback.path,
        "interpreter": fallback.interpreter,
        "below": fallback.below,
        "scheme": fallback.scheme,
        "bytes": (subject.path / fallback.path).stat().st_size,
        "sha256": run["model_sha256"],
        "measured": {
            "where": "host",
            "runtime": run["runtime"],
            "threads": run["threads"],
            "scored_batch_size": run["scored_batch_size"],
        },
        "metrics": measured_metrics(logits, run, split, reference, settings),
        "predictions": predicted_ids(logits),
    }


def evaluate_subjects(subjects: list[Subject], split: Split, settings: Settings) -> dict[str, Any]:
    """Evaluate the teacher (if any) first, then every other subject against it."""
    teachers = [s for s in subjects if s.role == "teacher"]
    out: dict[str, Any] = {
        "data": {
            "source": split.source,
            "sha256": split.sha256,
            "rows": len(split),
            "labels": split.label_names,
            "pairs": split.pairs is not None,
            "gold": split.labels,
        },
        "host": {"machine": platform.machine(), "cpus": os.cpu_count()},
        "teacher": None,
        "checkpoints": [],
        "artifacts": [],
    }
    teacher_logits = None
    if teachers:
        out["teacher"], teacher_logits = evaluate_subject(teachers[0], split, settings)
    for subject in subjects:
        if subject.role != "teacher":
            entry, _ = evaluate_subject(subject, split, settings, teacher_logits)
            out["checkpoints" if subject.role == "checkpoint" else "artifacts"].append(entry)
    return out


def evaluate_path(
    path: str | Path,
    data: str | Path,
    *,
    text: str = "text",
    text_pair: str | None = None,
    label: str | None = "label",
    teacher: str | Path | None = None,
) -> dict[str, Any]:
    """``compress eval``: one artifact, checkpoint or whole run on any data file, no recipe needed.

    A run brings its own teacher and evaluation settings (from its recipe); ``teacher`` replaces
    the run's teacher, or adds one to compare a single artifact against.
    """
    from compress.data import load_file
    from compress.io import require_path
    from compress.subjects import is_run, recipe_of_run, run_subjects, subject_at

    require_path(path, "point at an artifact folder, a checkpoint or a run folder")
    require_path(data, "pass --data a TSV, CSV or JSONL file")
    if teacher is not None:
        require_path(teacher, "pass --teacher a Hugging Face checkpoint folder")
    settings = Settings()
    if is_run(path):
        settings = Settings.from_recipe(recipe_of_run(path))
        subjects = run_subjects(path)
        if teacher is not None:
            subjects = [s for s in subjects if s.role != "teacher"]
    else:
        subjects = [subject_at(path)]
    if teacher is not None:
        subjects.insert(0, subject_at(teacher, teacher=True, name="teacher"))
    split = load_file(data, text=text, text_pair=text_pair, label=label, label_names=subjects[0].label_names)
    return evaluate_subjects(subjects, split, settings)
