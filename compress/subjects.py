"""What to evaluate: the models stored in a folder or a run, found by reading manifests, never by guessing.

An artifact folder says what it is in its manifest (``kind: artifact``); a stage folder says what it
produced (``produces: model|artifacts``); a run says which stage folders belong to it (run.json).
Each of those files is read through a typed schema below: keys compress needs are checked, keys a
newer compress adds are kept (additions keep a schema's version), and a path in a manifest must
stay inside its folder.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, StrictBool, StrictStr, field_validator

from compress.config import Open
from compress.errors import CompressError, ModelError
from compress.io import read_json, read_model

log = logging.getLogger(__name__)

Role = Literal["teacher", "checkpoint", "artifact"]
REDO_RUN = "run `compress run RECIPE --fresh` to write the run again"
REDO_ARTIFACT = "export the artifact again (compress run RECIPE --fresh)"


def inside_folder(rel: str) -> str:
    """A manifest path that names a file inside its own folder: relative, no '..', no empty parts."""
    parts = PurePosixPath(rel).parts
    if not rel or "\x00" in rel or "\\" in rel or rel.startswith("/") or ".." in parts or not parts:
        raise ValueError(f"path {rel!r} leaves its folder; a manifest lists files inside it only")
    return rel


SafePath = Annotated[StrictStr, AfterValidator(inside_folder)]


class Versioned(Open):
    """A file with a ``schema`` key ``<family>/1``: none (older versions) or version 1 is read; a newer
    major version needs the compress that wrote it. Subclasses name their ``family``."""

    family: ClassVar[str]
    schema_: StrictStr | None = Field(None, alias="schema")

    @field_validator("schema_")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        if value is not None and value != f"{cls.family}/1":
            raise ValueError(
                f"schema {value!r} is not {cls.family}/1; read it with the compress version that wrote it"
            )
        return value


class StageEntry(Open):
    type: StrictStr
    dir: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class TeacherLoad(Open):
    allow_pickle: StrictBool | None = None
    trust_remote_code: StrictBool | None = None


class RunFile(Versioned):
    """run.json: which stage folders belong to the run and where its teacher and recipe are."""

    family = "compress.run"
    recipe_file: StrictStr = ""
    teacher_dir: StrictStr | None = None
    teacher_load: TeacherLoad = Field(default_factory=lambda: TeacherLoad())
    """Loader flags; the two that weaken safety must be booleans, flags a newer compress adds are kept."""
    teacher_hub: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")] | None = None
    """The recipe's ``teacher.hub`` id when the run's model came from the Hub (None otherwise)."""
    stages: list[StageEntry]


class StageManifest(Versioned):
    """A stage folder's manifest.json: finished or not, and what it produced."""

    family = "compress.stage"
    complete: StrictBool = False
    produces: StrictStr | None = None
    """model or artifacts; a kind a newer compress adds is skipped here, as before."""


class FileEntry(Open):
    path: SafePath
    sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]
    bytes: Annotated[int, Field(ge=0)] | None = None


class ArtifactManifest(Versioned):
    """An artifact folder's manifest.json: the model file's format and every file with its sha256."""

    family = "compress.artifact"
    kind: Literal["artifact"]
    name: StrictStr | None = None
    format: Literal["onnx", "tflite"]
    target: StrictStr | None = None
    precision: StrictStr = "fp32"
    max_length: Annotated[int, Field(gt=0)]
    files: list[FileEntry]


class _Kind(Open):
    kind: Any = None


class HFConfig(Open):
    """The part of a Hugging Face config.json that evaluation needs: the label names by id."""

    id2label: dict[Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,5})$")], StrictStr] | None = None


def present(path: Path) -> bool:
    """Whether anything is at ``path`` (a FIFO, a dangling or looping link too), so that the reader,
    not an ``is_file()`` test, says what is wrong with it instead of treating it as absent."""
    return os.path.lexists(path)


def read_stage_manifest(folder: Path) -> StageManifest | None:
    path = folder / "manifest.json"
    return read_model(path, StageManifest, redo=REDO_RUN) if present(path) else None


def read_artifact_manifest(folder: Path) -> ArtifactManifest:
    return read_model(folder / "manifest.json", ArtifactManifest, redo=REDO_ARTIFACT)


def is_artifact_folder(folder: Path) -> bool:
    path = folder / "manifest.json"
    return present(path) and read_model(path, _Kind, redo=REDO_ARTIFACT).kind == "artifact"


def read_labels(path: Path) -> list[str]:
    """labels.json: a non-empty JSON list of distinct label names in id order."""
    labels = read_json(path, redo=REDO_ARTIFACT)
    if not isinstance(labels, list) or not labels or not all(isinstance(n, str) for n in labels):
        raise ModelError(f"{path}: must be a JSON list of label names in id order; {REDO_ARTIFACT}")
    if len(set(labels)) != len(labels):
        raise ModelError(f"{path}: a label name is listed twice; {REDO_ARTIFACT}")
    return labels


def read_run_file(run_dir: Path) -> RunFile:
    path = run_dir / "run.json"
    if not present(path):
        raise CompressError(
            f"{run_dir}: no run.json, so not a finished run; run `compress run RECIPE` first "
            "or point at one artifact folder"
        )
    return read_model(path, RunFile, redo=REDO_RUN)


def label_names_of_config(path: Path) -> list[str]:
    """Label names from a checkpoint's config.json, ids 0..N-1 with none missing."""
    config = read_model(path, HFConfig, redo="re-save the checkpoint (save_pretrained)")
    id2label = config.id2label
    if not id2label:
        raise ModelError(f"{path}: no id2label, so not a sequence classifier")
    ids = sorted(int(k) for k in id2label)
    if ids != list(range(len(ids))):
        raise ModelError(f"{path}: id2label ids {ids[:5]} are not 0..{len(ids) - 1}; fix id2label")
    return [id2label[str(i)] for i in ids]


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
    if not teacher and is_artifact_folder(folder):
        manifest = read_artifact_manifest(folder)
        labels_file = folder / "labels.json"
        if not present(labels_file):
            raise ModelError(f"{folder}: artifact has no labels.json; re-export it")
        return Subject(
            name or manifest.name or folder.name,
            folder,
            manifest.format,
            "artifact",
            read_labels(labels_file),
            manifest.target,
            manifest.precision,
        )
    if (folder / "config.json").is_file():
        names = label_names_of_config(folder / "config.json")
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
    return [(s.type, run_dir / s.dir) for s in read_run_file(run_dir).stages]


def _recipe_teacher(run_dir: Path, recipe: Any | None) -> Path:
    if recipe is None:
        teacher = read_run_file(run_dir).teacher_dir
        if not teacher:
            raise CompressError(f"{run_dir / 'run.json'}: no teacher_dir; {REDO_RUN}")
        return Path(teacher)
    from compress.models import resolve_teacher
    from compress.recipe_base import recipe_dir

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
        manifest = read_stage_manifest(folder)
        if manifest is None or manifest.complete is not True:
            log.warning("%s: stage not finished; skipped", folder)
            continue
        produces = manifest.produces
        if stage_type in STAGES and STAGES[stage_type].sets_teacher:
            teacher = folder
        elif produces == "model":
            found.append(subject_at(folder, name=folder.name))
        elif produces == "artifacts":
            found += [subject_at(sub) for sub in sorted(folder.iterdir()) if is_artifact_folder(sub)]
    if teacher is not None:
        return [subject_at(teacher, teacher=True, name="teacher"), *found]
    subject = subject_at(_recipe_teacher(run_dir, recipe), teacher=True, name="teacher")
    return [replace(subject, **_teacher_load_options(run_dir, recipe)), *found]


def _teacher_load_options(run_dir: Path, recipe: Any | None) -> dict[str, bool]:
    """What the recipe allows when loading its own teacher (pickle weights, remote code)."""
    if recipe is None:  # recorded in run.json by the run; an older run loads with the safe defaults
        if not present(run_dir / "run.json"):
            return {}
        options = read_run_file(run_dir).teacher_load
        flags = {"allow_pickle": options.allow_pickle, "trust_remote_code": options.trust_remote_code}
        return {k: v for k, v in flags.items() if v is not None}
    return recipe.teacher.load_options()


def is_run(path: str | Path) -> bool:
    return present(Path(path) / "run.json")


def recipe_of_run(run_dir: str | Path) -> Any:
    """The recipe a run was made from (run.json records its file)."""
    from compress.recipe import load_recipe

    run_file = read_run_file(Path(run_dir))
    if not run_file.recipe_file:
        raise CompressError(f"{Path(run_dir) / 'run.json'}: no recipe_file; {REDO_RUN}")
    return load_recipe(run_file.recipe_file)
