"""Orchestration only: run a recipe's stages in order into run folders, reusing finished ones.

``runs/<recipe>/plan.json`` records, before the first stage, everything the run is made from (the
recipe as resolved, its ``--set`` overrides, the teacher, target profiles and data files with their
hashes), so later commands read the run folder alone (``compress.subjects.recipe_of_run``).
``runs/<recipe>/<NN>-<stage>/`` holds each stage's output plus ``manifest.json``. A stage's hash
covers its config, the task, the data and everything upstream; a folder whose manifest has the
same hash is reused. Each stage writes into a temporary folder renamed into place when it
finishes, so a killed run leaves nothing that looks finished and the rerun resumes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from compress.errors import CompressError, RunLockedError
from compress.io import atomic_dir, file_entries, read_json, sha256_file, sha256_json, write_json_atomic
from compress.models import folder_weights_sha, resolve_teacher
from compress.recipe_base import recipe_dir, resolve_path
from compress.run_layout import (
    CACHE_DIR,
    LOCK_FILE,
    MANIFEST_FILE,
    PLAN_FILE,
    REPORT_FILE,
    RUN_FILE,
    RUN_LOG,
    stage_dir_name,
)
from compress.stage_context import FinishedStage, StageContext
from compress.stages import STAGES
from compress.subjects import PlanFile, recipe_of_plan, run_relative

log = logging.getLogger(__name__)

STAGE_SCHEMA = "compress.stage/1"
RUN_SCHEMA = "compress.run/1"
_VERSIONED = (
    "compress",
    "torch",
    "transformers",
    "tokenizers",
    "accelerate",
    "onnx",
    "onnxruntime",
    "litert-torch",
    "ai-edge-quantizer",
    "ai-edge-litert",
    "neural-compressor-pt",
)


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _VERSIONED:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


@dataclass
class StageOutcome:
    index: int
    type: str
    dir: Path
    reused: bool
    seconds: float
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunResult:
    run_dir: Path
    stages: list[StageOutcome]
    report: dict[str, Any] | None = None


def _write_pid(fd: int) -> None:
    """Record the holder's pid in the lock file, for the error a second process prints."""
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())


def _holder_pid(lock_file: Path) -> str:
    try:
        return lock_file.read_text().strip() or "?"
    except OSError:  # Windows denies reading a byte range another process has locked
        return "?"


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on the run folder; a second compress process on it fails at once.

    ``filelock`` takes the operating system's lock (flock on Unix, LockFileEx on Windows), so the
    kernel drops it when the process dies and a killed run never leaves the folder locked."""
    lock_file = run_dir / LOCK_FILE
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(lock_file, blocking=False, on_acquired=_write_pid)
        lock.acquire()
    except Timeout:
        raise RunLockedError(
            f"{run_dir}: another compress process (pid {_holder_pid(lock_file)}) is running this recipe; "
            "wait for it to finish or pass --out to use another folder"
        ) from None
    except OSError as exc:
        raise CompressError(
            f"{run_dir}: cannot create the run folder ({exc.strerror}); choose a writable folder with --out"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _remove_stale(run_dir: Path) -> None:
    """Delete temporary folders left by a killed run: they are never finished stages."""
    for tmp in run_dir.glob(".*.tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
    for old in run_dir.glob(".*.old-*"):
        shutil.rmtree(old, ignore_errors=True)


def finished_manifest(folder: Path, config_hash: str) -> dict[str, Any] | None:
    """The manifest of ``folder`` if it is a finished stage with this hash, else None."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        manifest = read_json(path)
    except (OSError, ValueError):
        return None
    if manifest.get("complete") is not True or manifest.get("config_hash") != config_hash:
        return None
    return manifest


def data_identity(recipe: Any) -> dict[str, Any]:
    """Hashes of the data sources (file contents for local files), so edited data reruns stages."""
    out: dict[str, Any] = {}
    for name in ("train", "eval", "test"):
        source = getattr(recipe.data, name)
        if source is None:
            continue
        spec = source.model_dump()
        if source.path:
            spec["path"] = sha256_file(resolve_path(recipe, source.path))
        out[name] = spec
    return out


def resolved_recipe(recipe: Any) -> dict[str, Any]:
    """The recipe as data with every default filled in and the paths a later command reads (data,
    a local teacher, a baseline report) resolved, so it means the same from any folder."""
    dump = recipe.model_dump(mode="json")

    def resolve(section: dict[str, Any] | None, key: str) -> None:
        if section and section.get(key):
            section[key] = str(resolve_path(recipe, section[key]).resolve())

    for split in ("train", "eval", "test"):
        resolve(dump["data"].get(split), "path")
    resolve(dump["teacher"], "path")
    resolve((dump.get("gates") or {}).get("baseline"), "report")
    return dump


def make_plan(
    recipe: Any, overrides: Sequence[str], run_dir: Path, teacher_dir: Path, teacher_sha: str
) -> PlanFile:
    """What the run is made from, resolved: written to plan.json before the first stage runs."""
    from compress.targets import targets_dir

    teacher = recipe.teacher
    source = "path" if teacher.path else "package" if teacher.package else "hub"
    teacher_id = str(teacher_dir.resolve()) if source == "path" else teacher.package or teacher.hub
    source_file = getattr(recipe, "_source", None)
    data = {}
    for split in ("train", "eval", "test"):
        spec = getattr(recipe.data, split)
        if spec is not None and spec.path:
            path = resolve_path(recipe, spec.path).resolve()
            data[split] = {"path": str(path), "sha256": sha256_file(path)}
    return PlanFile.model_validate(
        {
            "schema": f"{PlanFile.family}/1",
            "recipe": resolved_recipe(recipe),
            "recipe_file": str(source_file or ""),
            "base_dir": str(recipe_dir(recipe).resolve()),
            "overrides": list(overrides),
            "teacher": {
                "source": source,
                "id": teacher_id,
                "revision": teacher.revision,
                "dir": run_relative(run_dir, teacher_dir),
                "sha256": teacher_sha,
            },
            "targets": {
                name: {"file": str(targets_dir() / f"{name}.yaml"), "profile": recipe.target_profile(name)}
                for name in recipe.targets
            },
            "data": data,
            "stages": [
                {"index": i, "type": c.type, "dir": stage_dir_name(i, c.type)}
                for i, c in enumerate(recipe.stages, 1)
            ],
        }
    )


def stage_hash(config: Any, upstream: str, recipe: Any, data: dict[str, Any]) -> str:
    targets = {name: recipe.target_profile(name).model_dump() for name in recipe.targets}
    return sha256_json(
        {
            "stage": config.model_dump(),
            "upstream": upstream,
            "task": recipe.task.model_dump(),
            "data": data,
            "seed": recipe.seed,
            "targets": targets,
        }
    )


def _run_stage(
    spec: Any, folder: Path, ctx: StageContext, config_hash: str, inputs: dict[str, Any]
) -> dict[str, Any]:
    """Run one stage into a temporary folder and rename it into place with its manifest."""
    start = time.time()
    with atomic_dir(folder) as tmp:
        ctx.out_dir = tmp
        result = spec.run(ctx)
        manifest = {
            "schema": STAGE_SCHEMA,
            "stage": ctx.config.type,
            "index": ctx.index,
            "produces": spec.produces,
            "config": ctx.config.model_dump(),
            "config_hash": config_hash,
            "inputs": inputs,
            "files": file_entries(tmp),
            "metrics": result.metrics,
            "info": result.info,
            "wall_time_s": round(time.time() - start, 2),
            "versions": library_versions(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "complete": True,
        }
        write_json_atomic(tmp / MANIFEST_FILE, manifest)
    return manifest


def run_recipe(
    recipe: Any,
    out_dir: Path,
    *,
    fresh: bool = False,
    quiet: bool = False,
    overrides: Sequence[str] = (),
) -> RunResult:
    """Run every stage of ``recipe`` into ``out_dir/<name>``, then evaluate and report.

    ``overrides``: the ``--set`` overrides already applied to ``recipe``, recorded in plan.json as given.
    ``quiet``: what other libraries print (warnings, logs, converters' C++ output) goes to
    ``run.log`` in the run folder instead of the terminal, which keeps compress's lines and bars.
    """
    from compress.data import load_recipe_split
    from compress.model_folder import check_model_folder

    # Everything a stage will read is checked before the run folder is touched, so bad data or a
    # broken teacher fails in seconds and leaves nothing behind.
    teacher_dir = resolve_teacher(recipe.teacher, recipe_dir(recipe))
    check_model_folder(teacher_dir, allow_pickle=recipe.teacher.allow_pickle)
    ctx_splits = {
        name: load_recipe_split(recipe, name)
        for name in ("train", "eval", "test")
        if getattr(recipe.data, name) is not None
    }
    run_dir = (out_dir / recipe.name).resolve()
    with run_lock(run_dir), _third_party_output(run_dir / RUN_LOG, quiet):
        _remove_stale(run_dir)
        teacher_sha = folder_weights_sha(teacher_dir)
        upstream = sha256_json({"teacher": teacher_sha, "trust": recipe.teacher.trust_remote_code})
        plan = make_plan(recipe, overrides, run_dir, teacher_dir, teacher_sha)
        recipe_of_plan(run_dir, plan)  # what later commands rebuild must validate now, not after training
        write_json_atomic(run_dir / PLAN_FILE, plan.model_dump(mode="json", by_alias=True))
        data = data_identity(recipe)
        input_dir, previous, outcomes = teacher_dir, [], []
        cache_dir = run_dir / CACHE_DIR
        total = len(recipe.stages)
        for index, config in enumerate(recipe.stages, 1):
            spec = STAGES[config.type]
            folder = run_dir / stage_dir_name(index, config.type)
            config_hash = stage_hash(config, upstream, recipe, data)
            manifest = None if fresh else finished_manifest(folder, config_hash)
            reused = manifest is not None
            start = time.time()
            if reused:
                log.info("[%d/%d] %s: reused %s", index, total, config.type, folder)
            else:
                log.info("[%d/%d] %s: running", index, total, config.type)
                manifest = _run_stage(
                    spec,
                    folder,
                    StageContext(
                        recipe=recipe,
                        config=config,
                        index=index,
                        out_dir=folder,
                        run_dir=run_dir,
                        teacher_dir=teacher_dir,
                        input_dir=input_dir,
                        previous=list(previous),
                        cache_dir=cache_dir,
                        seed=recipe.seed,
                        _splits=ctx_splits,
                    ),
                    config_hash,
                    {
                        "upstream": upstream,
                        "input_dir": run_relative(run_dir, input_dir),
                        "teacher_dir": run_relative(run_dir, teacher_dir),
                        "data": data,
                    },
                )
                log.info("[%d/%d] %s: done in %.1fs", index, total, config.type, time.time() - start)
            outcomes.append(
                StageOutcome(
                    index,
                    config.type,
                    folder,
                    reused,
                    round(time.time() - start, 2),
                    manifest.get("metrics", {}),
                )
            )
            previous.append(FinishedStage(config.type, folder, manifest))
            upstream = config_hash
            if spec.produces == "model":
                input_dir = folder
            if spec.sets_teacher:
                teacher_dir = folder
        run_manifest = {
            "schema": RUN_SCHEMA,
            "recipe": recipe.name,
            "recipe_file": str(getattr(recipe, "_source", "")),
            "teacher_dir": run_relative(run_dir, teacher_dir),
            "teacher_load": recipe.teacher.load_options(),
            "teacher_hub": recipe.teacher.hub,  # the Hub id a hub teacher came from (model cards' base_model)
            "stages": [{"index": o.index, "type": o.type, "dir": o.dir.name} for o in outcomes],
            "plan_sha256": sha256_file(run_dir / PLAN_FILE),
        }
        reported = _read_json_or_empty(run_dir / RUN_FILE).get("report_hash")
        # the report reads the run back from run.json and plan.json, as `compress report` does
        write_json_atomic(run_dir / RUN_FILE, run_manifest)
        if not recipe.evaluate.enabled:
            return RunResult(run_dir, outcomes)
        report, report_hash = _report(run_dir, recipe, upstream, fresh, reported)
        write_json_atomic(run_dir / RUN_FILE, {**run_manifest, "report_hash": report_hash})
        return RunResult(run_dir, outcomes, report)


@contextlib.contextmanager
def _third_party_output(log_path: Path, quiet: bool) -> Iterator[None]:
    if not quiet:
        yield
        return
    from compress.terminal import routed

    with routed(log_path):
        log.info("other libraries' warnings and logs: %s (-v shows them here)", log_path)
        yield


def _report(
    run_dir: Path, recipe: Any, upstream: str, fresh: bool, reported: str | None
) -> tuple[dict[str, Any], str]:
    """Evaluate every artifact against the teacher and judge the gates; reused when nothing changed.

    The hash covers the last stage (and so everything upstream), the evaluation settings, the
    gates and the held-out data, so an identical rerun does not spend minutes re-measuring.
    """
    from compress.report import apply_gates, build_run_report, load_report, write_report

    report_hash = sha256_json(
        {
            "upstream": upstream,
            "evaluate": recipe.evaluate.model_dump(),
            "gates": recipe.gates.model_dump() if recipe.gates else None,
            "data": data_identity(recipe),
        }
    )
    if not fresh and reported == report_hash and (run_dir / REPORT_FILE).is_file():
        log.info("report: reused %s", run_dir / REPORT_FILE)
        report = load_report(run_dir / REPORT_FILE)
        apply_gates(report)
        write_report(run_dir, report)
    else:
        log.info("report: evaluating the teacher and every artifact")
        report = build_run_report(run_dir, recipe)
    return report, report_hash


def _read_json_or_empty(path: Path) -> dict[str, Any]:
    try:
        value = read_json(path)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
