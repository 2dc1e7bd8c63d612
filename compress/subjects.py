"""What to evaluate: the models stored in a folder or a run, found by reading manifests, never by guessing.

An artifact folder says what it is in its manifest (``kind: artifact``); a stage folder says what it
produced (``produces: model|artifacts``); a run says which stage folders belong to it (run.json) and
what it was made from (plan.json: the recipe as it ran, with its overrides, teacher, targets and
data files), so every command after ``compress run`` reads the run folder and never the recipe file.
Each of those files is read through a typed schema below: keys compress needs are checked, keys a
newer compress adds are kept (additions keep a schema's version), and a path in a manifest must
stay inside its folder. Paths inside the run folder are stored relative to it, so a moved run
folder still reads; paths outside it (data, a local teacher) are stored resolved, with a hash.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, StrictBool, StrictStr, field_validator

from compress.config import Open
from compress.errors import BadFile, CompressError, DataError, ModelError
from compress.io import read_json, read_model
from compress.run_layout import MANIFEST_FILE, PLAN_FILE, RUN_FILE
from compress.targets import TargetProfile

log = logging.getLogger(__name__)

Role = Literal["teacher", "checkpoint", "artifact"]
REDO_RUN = "run `compress run RECIPE --fresh` to write the run again"
REDO_ARTIFACT = "export the artifact again (compress run RECIPE --fresh)"
REDO_PLAN = "run `compress run RECIPE` again to write the run's plan"


def inside_folder(rel: str) -> str:
    """A manifest path that names a file inside its own folder: relative, no '..', no empty parts."""
    parts = PurePosixPath(rel).parts
    if not rel or "\x00" in rel or "\\" in rel or rel.startswith("/") or ".." in parts or not parts:
        raise ValueError(f"path {rel!r} leaves its folder; a manifest lists files inside it only")
    return rel


SafePath = Annotated[StrictStr, AfterValidator(inside_folder)]
Sha256 = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]


def run_relative(run_dir: Path, path: Path) -> str:
    """How a run file stores ``path``: relative (POSIX) when inside the run folder, else resolved."""
    resolved = Path(path).resolve()
    inside = resolved.is_relative_to(run_dir.resolve()) and resolved != run_dir.resolve()
    return resolved.relative_to(run_dir.resolve()).as_posix() if inside else str(resolved)


def _absolute_or_inside(stored: str) -> str:
    return stored if Path(stored).is_absolute() else inside_folder(stored)


RunPath = Annotated[StrictStr, AfterValidator(_absolute_or_inside)]
"""A path a run file stores (``run_relative``): absolute, or relative inside the run folder."""


def in_run(run_dir: Path, stored: str) -> Path:
    """A ``RunPath`` as a path: absolute as is, relative from the run folder."""
    return Path(stored) if Path(stored).is_absolute() else run_dir / stored


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
    """run.json: which stage folders belong to the run, where its teacher is (relative to the run
    folder for a finetuned teacher) and the sha256 of the plan it ran (None: an older compress)."""

    family = "compress.run"
    recipe_file: StrictStr = ""
    """Where the recipe was read from; only a run without a plan (an older compress) reads it."""
    teacher_dir: RunPath | None = None
    plan_sha256: Sha256 | None = None
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


class InputFile(Open):
    """A file outside the run folder that the run read: where it was (resolved) and its sha256."""

    path: StrictStr
    sha256: Sha256


class PlannedTeacher(Open):
    """The teacher the run started from: how the recipe named it, the folder that held it, its hash."""

    source: Literal["path", "hub", "package"]
    id: StrictStr
    """The resolved local folder, the Hub id or the ``pkg/sub/dir`` package spec."""
    revision: StrictStr | None = None
    dir: RunPath
    """Its files' folder when the run started (``run_relative``): a Hub teacher's is a cache snapshot."""
    sha256: Sha256
    """``compress.models.folder_weights_sha`` of that folder: weights, config and tokenizer."""


class PlannedTarget(Open):
    file: StrictStr
    """The profile file it was read from (information: the profile below is what the run used)."""
    profile: TargetProfile
    """With the recipe's ``target_options`` applied."""


class PlanFile(Versioned):
    """plan.json, written by ``compress run`` before its first stage: everything the run was made from."""

    family = "compress.plan"
    recipe: dict[str, Any]
    """The validated recipe after ``--set`` overrides, every default filled in, data, teacher and
    baseline paths resolved; validated again as a recipe when a command rebuilds it."""
    recipe_file: StrictStr
    """Where the recipe was read from (information only: no command reads it after the run)."""
    base_dir: StrictStr
    """The folder the recipe's other relative paths (a stage's extra data) resolve against."""
    overrides: list[StrictStr] = Field(default_factory=list)
    """The ``--set KEY=VALUE`` overrides as given, already applied to ``recipe``."""
    teacher: PlannedTeacher
    targets: dict[StrictStr, PlannedTarget] = Field(default_factory=dict)
    data: dict[Literal["train", "eval", "test"], InputFile] = Field(default_factory=dict)
    """The local data files (a Hub split is named in ``recipe`` only)."""
    stages: list[StageEntry]


class FileEntry(Open):
    path: SafePath
    sha256: Sha256
    bytes: Annotated[int, Field(ge=0)] | None = None


class FallbackModel(Open):
    """One ``fallbacks`` entry of a TFLite artifact: a second model for an interpreter below a version."""

    path: Annotated[SafePath, Field(pattern=r"\.tflite$")]
    interpreter: Literal["ai_edge_litert", "tflite_runtime"]
    below: Annotated[StrictStr, Field(pattern=r"^[0-9]+(\.[0-9]+)*$")]
    scheme: StrictStr
    reason: StrictStr


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
    fallbacks: list[FallbackModel] = Field(default_factory=list)
    """TFLite: second models for interpreters that compute the primary wrongly (``artifact_fallbacks``)."""


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
    path = folder / MANIFEST_FILE
    return read_model(path, StageManifest, redo=REDO_RUN) if present(path) else None


def read_artifact_manifest(folder: Path) -> ArtifactManifest:
    return read_model(folder / MANIFEST_FILE, ArtifactManifest, redo=REDO_ARTIFACT)


def artifact_fallbacks(folder: Path, manifest: ArtifactManifest) -> list[FallbackModel]:
    """The manifest's fallback models, each a .tflite file the manifest lists with its sha256."""
    path = folder / MANIFEST_FILE
    if manifest.fallbacks and manifest.format != "tflite":
        raise CompressError(
            f"{path}: 'fallbacks' are TFLite models, this is {manifest.format}; {REDO_ARTIFACT}"
        )
    listed = {entry.path for entry in manifest.files}
    for entry in manifest.fallbacks:
        if entry.path not in listed:
            raise CompressError(
                f"{path}: fallback model {entry.path!r} is not listed in files (no sha256); {REDO_ARTIFACT}"
            )
    return manifest.fallbacks


def is_artifact_folder(folder: Path) -> bool:
    path = folder / MANIFEST_FILE
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
    path = run_dir / RUN_FILE
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
    fallbacks: tuple[FallbackModel, ...] = ()
    """A TFLite artifact's fallback models, measured beside its primary model."""


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
            fallbacks=tuple(artifact_fallbacks(folder, manifest)),
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


def read_plan(run_dir: Path) -> PlanFile | None:
    """The plan of the run's finished ``compress run``, checked against the sha256 run.json records;
    None for a run that an older compress made (no ``plan_sha256`` in run.json)."""
    from compress.io import sha256_file

    recorded = read_run_file(run_dir).plan_sha256
    if recorded is None:
        return None
    path = run_dir / PLAN_FILE
    if not present(path):
        raise BadFile(f"{path}: missing, but run.json says the run wrote one; {REDO_PLAN}")
    plan = read_model(path, PlanFile, redo=REDO_PLAN)
    if sha256_file(path) != recorded:
        raise BadFile(
            f"{path}: changed since the run wrote it (its sha256 is not run.json's plan_sha256), or a "
            f"later `compress run` into this folder did not finish; {REDO_PLAN}"
        )
    return plan


def _stage_folders(run_dir: Path, plan: PlanFile | None = None) -> list[tuple[str, Path]]:
    stages = plan.stages if plan is not None else read_run_file(run_dir).stages
    return [(s.type, in_run(run_dir, s.dir)) for s in stages]


def _run_teacher(run_dir: Path, plan: PlanFile | None) -> Path:
    """The teacher a run started from: the plan's, checked to be the folder the run hashed; an older
    run's from run.json (relative to the run folder, or absolute)."""
    if plan is None:
        teacher = read_run_file(run_dir).teacher_dir
        if not teacher:
            raise CompressError(f"{run_dir / RUN_FILE}: no teacher_dir; {REDO_RUN}")
        return in_run(run_dir, teacher)
    from compress.models import folder_weights_sha

    planned = plan.teacher
    folder = in_run(run_dir, planned.dir)
    where = f"{run_dir / PLAN_FILE}: teacher {planned.id}"
    if not folder.is_dir():
        raise ModelError(f"{where}: its folder {folder} is gone; put it back there or {REDO_PLAN}")
    if folder_weights_sha(folder) != planned.sha256:
        raise ModelError(
            f"{where}: {folder} changed since the run (weights, config or tokenizer sha256 differs); "
            f"restore the teacher the run used or {REDO_PLAN}"
        )
    return folder


def run_subjects(run_dir: str | Path) -> list[Subject]:
    """The teacher, each checkpoint a stage produced and every artifact of a run, in stage order.

    Stage folders come from the run's plan (or an older run's run.json), so a folder left over from an
    older version of the recipe is never reported as part of this run.
    """
    from compress.stages import STAGES

    run_dir = Path(run_dir)
    plan = read_plan(run_dir)
    if plan is not None:
        recipe_of_plan(run_dir, plan)  # a plan whose recipe no longer validates is not trusted either
    teacher, found = None, []
    for stage_type, folder in _stage_folders(run_dir, plan):
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
    subject = subject_at(_run_teacher(run_dir, plan), teacher=True, name="teacher")
    return [replace(subject, **_teacher_load_options(run_dir, plan)), *found]


def _teacher_load_options(run_dir: Path, plan: PlanFile | None) -> dict[str, bool]:
    """What the recipe allows when loading its own teacher (pickle weights, remote code): the plan's
    recipe says; an older run recorded it in run.json, and one older still loads with the safe defaults."""
    if plan is not None:
        teacher = plan.recipe.get("teacher")
        flags = teacher if isinstance(teacher, dict) else {}
    elif present(run_dir / RUN_FILE):
        flags = read_run_file(run_dir).teacher_load.model_dump()
    else:
        return {}
    return {k: flags[k] for k in ("allow_pickle", "trust_remote_code") if isinstance(flags.get(k), bool)}


def is_run(path: str | Path) -> bool:
    return present(Path(path) / RUN_FILE)


def recipe_of_plan(run_dir: Path, plan: PlanFile) -> Any:
    """The recipe a plan records, validated as a recipe again, with the target profiles the run used.

    Relative paths a stage reads (extra data) resolve against the recipe's folder as in the run."""
    from pydantic import ValidationError

    from compress.io import schema_error_line
    from compress.recipe import recipe_model

    where = run_dir / PLAN_FILE
    try:
        recipe = recipe_model().model_validate(plan.recipe)
    except ValidationError as exc:
        raise BadFile(schema_error_line(f"{where}: recipe", exc, REDO_PLAN)) from None
    # recipe_dir() is the folder of ``_source``: the plan's base_dir, whatever the file was called
    recipe._source = Path(plan.base_dir) / (Path(plan.recipe_file).name or "recipe")
    if sorted(recipe.targets) != sorted(plan.targets):
        raise BadFile(
            f"{where}: targets {sorted(plan.targets)} are not the recipe's {recipe.targets}; {REDO_PLAN}"
        )
    for name, planned in plan.targets.items():
        if recipe.target_profile(name) != planned.profile:
            raise BadFile(
                f"{where}: target profile {name} ({planned.file}) changed since the run; restore the "
                f"profile the run used or {REDO_PLAN}"
            )
    return recipe


def check_planned_data(run_dir: Path, plan: PlanFile) -> None:
    """Each local data file the run read is still there with the content it had (sha256)."""
    from compress.io import require_regular_file, sha256_file

    for split, entry in plan.data.items():
        path = Path(entry.path)
        fix = f"put the {split} file the run used back there or {REDO_PLAN}"
        require_regular_file(path, f"{run_dir / PLAN_FILE} data.{split}: {fix}")
        if sha256_file(path) != entry.sha256:
            raise DataError(
                f"{path}: changed since the run (sha256 differs from {run_dir / PLAN_FILE} data.{split}); "
                f"{fix}"
            )


def recipe_of_run(run_dir: str | Path, *, data: bool = False) -> Any:
    """The recipe a run was made from, rebuilt from its plan.json (never from the recipe file, which may
    have been edited, moved or deleted since). ``data``: the run's local data files will be read, so
    check they are the files the run used. A run made by a compress without plans reads its recipe
    file, as that compress did."""
    from compress.recipe import load_recipe

    run_dir = Path(run_dir)
    plan = read_plan(run_dir)
    if plan is not None:
        recipe = recipe_of_plan(run_dir, plan)
        if data:
            check_planned_data(run_dir, plan)
        return recipe
    run_file = read_run_file(run_dir)
    if not run_file.recipe_file:
        raise CompressError(f"{run_dir / RUN_FILE}: no recipe_file; {REDO_RUN}")
    log.warning(
        "%s: made by a compress without plan.json, so its recipe file %s is read again (edits since the "
        "run count); run it again to record a plan",
        run_dir,
        run_file.recipe_file,
    )
    return load_recipe(run_file.recipe_file)
