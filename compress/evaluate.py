"""Evaluate the teacher, checkpoints and artifacts on the same data, each through its own runtime.

Every model runs in a fresh worker process (``compress.evaluate_worker``) with its own saved
tokenizer: a checkpoint through PyTorch, an ``.onnx`` through onnxruntime and a ``.tflite``
through LiteRT, via the runner that ships in deploy bundles. The logits come back here, where
task metrics and fidelity to the teacher are computed the same way for all of them.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from compress.data import Split
from compress.errors import CompressError, DataError, ModelError
from compress.footprint import artifact_parameters, model_bytes_and_sha, total_bytes
from compress.io import read_json
from compress.metrics import fidelity_metrics, task_metrics

log = logging.getLogger(__name__)

Role = Literal["teacher", "checkpoint", "artifact"]


@dataclass(frozen=True)
class Subject:
    """One model to evaluate and what is known about it before running it."""

    name: str
    path: Path
    format: Literal["torch", "onnx", "tflite"]
    role: Role
    label_names: list[str]
    target: str | None = None
    precision: str = "fp32"


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


def subject_at(path: str | Path, *, teacher: bool = False, name: str | None = None) -> Subject:
    """The model stored in a folder: an artifact (manifest kind ``artifact``) or a Hugging Face checkpoint."""
    folder = Path(path)
    folder = folder.parent if folder.is_file() else folder
    manifest_path = folder / "manifest.json"
    manifest = read_json(manifest_path) if manifest_path.is_file() else {}
    if manifest.get("kind") == "artifact" and not teacher:
        labels_file = folder / "labels.json"
        if not labels_file.is_file():
            raise ModelError(f"{folder}: artifact has no labels.json; re-export it")
        return Subject(
            name or manifest.get("name") or folder.name,
            folder,
            manifest["format"],
            "artifact",
            [str(n) for n in read_json(labels_file)],
            manifest.get("target"),
            manifest.get("precision", "fp32"),
        )
    if (folder / "config.json").is_file():
        id2label = read_json(folder / "config.json").get("id2label") or {"0": "0", "1": "1"}
        names = [str(id2label[k]) for k in sorted(id2label, key=int)]
        return Subject(name or folder.name, folder, "torch", "teacher" if teacher else "checkpoint", names)
    what = (
        "a Hugging Face checkpoint (config.json)"
        if teacher
        else (
            "an artifact folder (manifest.json with kind: artifact), a Hugging Face checkpoint "
            "(config.json) or a run folder"
        )
    )
    raise ModelError(f"{folder}: not {what}; point at one of them")


def _stage_folders(run_dir: Path, recipe: Any | None) -> list[tuple[str, Path]]:
    if recipe is not None:
        return [(s.type, run_dir / f"{i:02d}-{s.type}") for i, s in enumerate(recipe.stages, 1)]
    if not (run_dir / "run.json").is_file():
        raise CompressError(
            f"{run_dir}: no run.json, so not a finished run; run `compress run RECIPE` first "
            "or point at one artifact folder"
        )
    return [(s["type"], run_dir / s["dir"]) for s in read_json(run_dir / "run.json")["stages"]]


def _recipe_teacher(run_dir: Path, recipe: Any | None) -> Path:
    if recipe is None:
        return Path(read_json(run_dir / "run.json")["teacher_dir"])
    from compress.models import resolve_teacher
    from compress.recipe import recipe_dir

    return resolve_teacher(recipe.teacher, recipe_dir(recipe))


def run_subjects(run_dir: str | Path, recipe: Any | None = None) -> list[Subject]:
    """The teacher, each checkpoint a stage produced and every artifact of a run, in stage order.

    Stage folders come from the recipe (or the run's run.json), so a folder left over from an
    older version of the recipe is never reported as part of this run.
    """
    from compress.stages import STAGES

    run_dir = Path(run_dir)
    teacher, found = None, []
    for stage_type, folder in _stage_folders(run_dir, recipe):
        manifest_path = folder / "manifest.json"
        if not manifest_path.is_file() or read_json(manifest_path).get("complete") is not True:
            log.warning("%s: stage not finished; skipped", folder)
            continue
        produces = read_json(manifest_path).get("produces")
        if stage_type in STAGES and STAGES[stage_type].sets_teacher:
            teacher = folder
        elif produces == "model":
            found.append(subject_at(folder, name=folder.name))
        elif produces == "artifacts":
            found += [
                subject_at(sub)
                for sub in sorted(folder.iterdir())
                if (sub / "manifest.json").is_file()
                and read_json(sub / "manifest.json").get("kind") == "artifact"
            ]
    teacher = teacher or _recipe_teacher(run_dir, recipe)
    return [subject_at(teacher, teacher=True, name="teacher"), *found]


def threads_for(subject: Subject, settings: Settings) -> int:
    """The thread count to measure with, capped at this machine's cores (oversubscription only adds noise)."""
    wanted = settings.threads
    if wanted is None and subject.target:
        from compress.targets import load_target

        wanted = load_target(subject.target).threads
    return max(1, min(wanted or settings.teacher_threads, os.cpu_count() or 1))


def _worker_env(threads: int) -> dict[str, str]:
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def run_worker(subject: Subject, split: Split, settings: Settings) -> tuple[np.ndarray, dict[str, Any]]:
    """Run ``subject`` on ``split`` in a fresh process; return its logits and measurements."""
    threads = threads_for(subject, settings)
    with tempfile.TemporaryDirectory(prefix="compress-eval-") as tmp:
        request = {
            "model": str(subject.path),
            "kind": "torch" if subject.format == "torch" else "artifact",
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
            env=_worker_env(threads),
            capture_output=True,
            text=True,
        )
        result = read_json(f"{tmp}/result.json") if Path(tmp, "result.json").is_file() else {}
        if proc.returncode != 0:
            if "error" in result:
                raise CompressError(f"{subject.path}: {result['error']}")
            raise RuntimeError(f"evaluating {subject.path} failed:\n{proc.stderr[-4000:]}")
        return np.load(f"{tmp}/logits.npy"), result


def evaluate_subject(
    subject: Subject, split: Split, settings: Settings, teacher_logits: np.ndarray | None = None
) -> tuple[dict[str, Any], np.ndarray]:
    """One report entry (identity, footprint, measurements, metrics) and the subject's logits."""
    log.info("evaluating %s (%s) on %d rows", subject.name, subject.format, len(split))
    logits, run = run_worker(subject, split, settings)
    if logits.shape[-1] != len(split.label_names):
        raise DataError(
            f"{subject.path} predicts {logits.shape[-1]} classes but {split.source} has "
            f"{len(split.label_names)} labels {split.label_names}; evaluate it on data for its task"
        )
    size, sha = model_bytes_and_sha(subject.path, subject.format)
    metrics: dict[str, Any] = {}
    if split.labels is not None:
        metrics.update(task_metrics(logits, split.labels, split.label_names))
    if teacher_logits is not None and subject.role != "teacher":
        metrics.update(fidelity_metrics(logits, teacher_logits))
    for key in ("latency_ms", "throughput", "peak_rss_bytes", "rss_before_load_bytes"):
        metrics[key] = run[key]
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
        },
        "metrics": metrics,
    }
    return entry, logits


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
