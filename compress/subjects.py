"""What to evaluate: the models stored in a folder or a run, found by reading manifests, never by guessing.

An artifact folder says what it is in its manifest (``kind: artifact``); a stage folder says what it
produced (``produces: model|artifacts``); a run says which stage folders belong to it (run.json).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from compress.errors import CompressError, ModelError
from compress.io import read_json

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
    allow_pickle: bool = False
    """Only for a recipe teacher that opts in (``teacher.allow_pickle``); checkpoints are safetensors."""
    trust_remote_code: bool = False


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
        id2label = read_json(folder / "config.json").get("id2label")
        if not id2label:
            raise ModelError(f"{folder}/config.json: no id2label, so not a sequence classifier")
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
        manifest = read_json(folder / "manifest.json") if (folder / "manifest.json").is_file() else {}
        if manifest.get("complete") is not True:
            log.warning("%s: stage not finished; skipped", folder)
            continue
        produces = manifest.get("produces")
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
    if teacher is not None:
        return [subject_at(teacher, teacher=True, name="teacher"), *found]
    subject = subject_at(_recipe_teacher(run_dir, recipe), teacher=True, name="teacher")
    return [replace(subject, **_teacher_load_options(run_dir, recipe)), *found]


def _teacher_load_options(run_dir: Path, recipe: Any | None) -> dict[str, bool]:
    """What the recipe allows when loading its own teacher (pickle weights, remote code)."""
    if recipe is None:  # recorded in run.json by the run; an older run loads with the safe defaults
        run_file = run_dir / "run.json"
        options = read_json(run_file).get("teacher_load", {}) if run_file.is_file() else {}
        return {k: bool(options[k]) for k in ("allow_pickle", "trust_remote_code") if k in options}
    return recipe.teacher.load_options()


def is_run(path: str | Path) -> bool:
    return (Path(path) / "run.json").is_file()


def recipe_of_run(run_dir: str | Path) -> Any:
    """The recipe a run was made from (run.json records its file)."""
    from compress.recipe import load_recipe

    run_file = Path(run_dir) / "run.json"
    if not run_file.is_file():
        raise CompressError(f"{run_dir}: no run.json; run `compress run RECIPE` first")
    return load_recipe(read_json(run_file)["recipe_file"])
