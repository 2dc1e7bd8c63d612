"""The Python API: what ``compress run`` and a recipe's stages do, as functions for a notebook or script.

    from compress.api import distill, export, quantize, evaluate

    student = distill("teacher/", {"train": "train.tsv", "eval": "dev.tsv"}, {"layers": 3}, "out/student")
    fp32 = export(student, ["arm64-onnx"], "out/export", data="dev.tsv")
    int8 = quantize(fp32, "out/int8", data="dev.tsv", options={"scheme": "dynamic"})
    print(evaluate(int8.artifacts[0], "dev.tsv").metrics["accuracy"])

Each stage function builds the same one-stage recipe a YAML file would give (so its options are
validated by the stage's own config class and a bad one is the same one-line ``RecipeError``), runs
the stage's handler into a temporary folder and renames it to ``out_dir`` with the same
``manifest.json`` a run folder's stage has. Stage calls whose ``out_dir`` share a parent folder share
``<parent>/.cache`` (the teacher's outputs, distillation checkpoints), as the stages of a run do.

Models are model folders (a Hugging Face checkpoint), the ``Output`` of an earlier call, or an
in-memory ``(model, tokenizer)`` pair from ``transformers`` (saved to a temporary folder for the
call). Data is a TSV/CSV/JSONL path, a data-source mapping as in a recipe (``{"path": ..., "limit":
100}``), or in-memory rows ``(text, label)`` / ``(text, pair, label)``; ``data`` is one such source
for every split or a mapping ``{"train": ..., "eval": ..., "test": ...}``.

The stage context is built here and in the pipeline only: benchmarks and tests call ``run_stage``
(one stage of a loaded recipe, without the run's final report) or ``stage_context``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compress.errors import DataError, ModelError, RecipeError
from compress.run_layout import CACHE_DIR, MANIFEST_FILE
from compress.stage_context import FinishedStage, StageContext

if TYPE_CHECKING:
    from compress.pipeline import RunResult

SPLITS = ("train", "eval", "test")


@dataclass(frozen=True)
class Output:
    """What one stage call wrote: its folder, and the manifest it wrote there."""

    stage: str
    dir: Path
    source: Path
    """The model folder the stage started from (an export's source is what ``quantize`` reuses)."""
    metrics: dict[str, Any]
    info: dict[str, Any]
    manifest: dict[str, Any] | None
    """``dir/manifest.json``; None on a non-main process of a data-parallel run, which writes nothing."""

    @property
    def artifacts(self) -> list[Path]:
        """The artifact folders an ``export`` or ``quantize`` call wrote, by name."""
        return sorted(p.parent for p in self.dir.glob("*/manifest.json"))


@dataclass(frozen=True)
class Evaluation:
    """``evaluate``'s answer: the model's metrics and the whole result ``compress eval --json`` writes."""

    path: Path
    metrics: dict[str, Any]
    result: dict[str, Any]


class _CallContext(StageContext):
    """A stage called from Python: its errors name the call's options, not a recipe file."""

    def where(self) -> str:
        return f"{self.config.type} options"


def run(
    recipe: str | Path,
    overrides: Sequence[str] | Mapping[str, Any] | None = None,
    *,
    out: str | Path = "runs",
    fresh: bool = False,
    quiet: bool = False,
) -> RunResult:
    """``compress run RECIPE --set K=V --out OUT [--fresh]``: every stage, then the report.

    ``overrides`` are ``--set`` strings (``"stages.1.epochs=2"``) or a mapping from key to value.
    Failed gates do not raise: they are in ``result.report["gates"]`` (verdict ``fail``)."""
    from compress.pipeline import run_recipe
    from compress.recipe import load_recipe

    if isinstance(overrides, Mapping):
        overrides = [f"{key}={json.dumps(value)}" for key, value in overrides.items()]
    sets = list(overrides or ())
    return run_recipe(load_recipe(recipe, sets), Path(out), fresh=fresh, quiet=quiet, overrides=sets)


def distill(
    teacher: Any,
    data: Any,
    options: Any,
    out_dir: str | Path,
    *,
    task: Any = None,
    seed: int = 0,
    cache_dir: str | Path | None = None,
) -> Output:
    """Train a shallower student of ``teacher`` (the ``distill`` stage): options as a ``DistillConfig``
    or its dict (``{"layers": 3, "epochs": 3}``); ``data`` needs train and eval rows (eval picks the
    best epoch). ``task``: a recipe's ``task`` section (columns, label names, max_length)."""
    return _call(
        "distill", options, out_dir, model=teacher, data=data, task=task, seed=seed, cache_dir=cache_dir
    )


def share(
    model: Any,
    data: Any,
    options: Any,
    out_dir: str | Path,
    *,
    teacher: Any = None,
    task: Any = None,
    seed: int = 0,
    cache_dir: str | Path | None = None,
) -> Output:
    """ALBERT-style sharing of ``model`` (the ``share`` stage), recovered by distillation against
    ``teacher`` (default: ``model`` itself); ``data`` needs train and eval rows."""
    return _call(
        "share",
        options,
        out_dir,
        model=model,
        teacher=teacher,
        data=data,
        task=task,
        seed=seed,
        cache_dir=cache_dir,
    )


def export(
    model: Any,
    targets: Sequence[str],
    out_dir: str | Path,
    *,
    data: Any,
    options: Any = None,
    task: Any = None,
    cache_dir: str | Path | None = None,
) -> Output:
    """One fp32 artifact per target profile (``arm64-onnx``, ...), each checked against ``model`` on
    the first eval rows (``options.check_samples``). ``data``: the eval rows (one source)."""
    return _call(
        "export",
        options or {},
        out_dir,
        model=model,
        data=data,
        needed=("eval",),
        task=task,
        targets=targets,
        cache_dir=cache_dir,
    )


def quantize(
    model: Any,
    out_dir: str | Path,
    *,
    data: Any,
    targets: Sequence[str] | None = None,
    options: Any = None,
    task: Any = None,
    seed: int = 0,
    cache_dir: str | Path | None = None,
) -> Output:
    """One int8 artifact per target, measured against its fp32 source on the eval rows.

    ``model``: the ``Output`` (or folder) of an ``export`` call, whose fp32 artifacts are reused and
    whose targets are the default, or a model to export first. Static schemes calibrate on the train
    rows (the eval rows when ``data`` has no train split)."""
    previous: list[FinishedStage] = []
    exported = _export_folder(model)
    if exported is not None:
        folder, source, manifest = exported
        previous.append(FinishedStage("export", folder, manifest))
        if targets is None:
            targets = _artifact_targets(folder)
        model = source
    if not targets:
        raise RecipeError("quantize: no targets; pass targets=['arm64-onnx', ...] or an export's output")
    return _call(
        "quantize",
        options or {},
        out_dir,
        model=model,
        data=data,
        needed=("eval",),
        task=task,
        targets=targets,
        seed=seed,
        cache_dir=cache_dir,
        previous=previous,
    )


def evaluate(
    model: Any,
    data: Any,
    *,
    teacher: str | Path | None = None,
    task: Any = None,
    latency_samples: int = 200,
    warmup: int = 10,
) -> Evaluation:
    """``compress eval MODEL --data FILE [--teacher T]``: accuracy (and agreement with ``teacher``),
    latency and size of an artifact folder, a checkpoint folder or a one-artifact ``Output``, each
    through its own runtime. ``data``: one file or in-memory rows; ``task`` names the file's columns."""
    from compress.evaluate import Settings, evaluate_subjects
    from compress.subjects import subject_at

    path = _evaluated_folder(model)
    spec = _task(task)
    subjects = [subject_at(path)]
    if teacher is not None:
        subjects.insert(0, subject_at(Path(teacher), teacher=True, name="teacher"))
    if isinstance(data, Mapping) and data and set(data) <= set(SPLITS):
        data = data.get("test", data.get("eval"))  # as the run's report: test when there is one
    with tempfile.TemporaryDirectory(prefix="compress-api-") as tmp:
        source = _source_spec("eval", data, spec, Path(tmp))
        if "path" not in source:
            raise DataError("evaluate: data must be a local file or rows of (text, label)")
        split = _file_split(Path(source["path"]), spec, subjects[0].label_names, source)
        settings = Settings(latency_samples=latency_samples, warmup=warmup)
        result = evaluate_subjects(subjects, split, settings)
    entries = result["artifacts"] or result["checkpoints"]
    return Evaluation(path, entries[0]["metrics"], result)


def run_stage(
    recipe: Any,
    out_dir: str | Path,
    *,
    index: int = 1,
    config: Any = None,
    teacher: str | Path | None = None,
    model: str | Path | None = None,
    cache_dir: str | Path | None = None,
) -> Output:
    """Stage ``index`` (1-based) of a loaded recipe alone, into ``out_dir``, without the run's report.

    ``config`` replaces that stage's config; ``teacher`` the recipe's teacher folder and ``model`` the
    stage's input (default: the teacher)."""
    ctx = stage_context(
        recipe, out_dir, index=index, config=config, teacher=teacher, model=model, cache_dir=cache_dir
    )
    return _execute(ctx)


def stage_context(
    recipe: Any,
    out_dir: str | Path,
    *,
    index: int = 1,
    config: Any = None,
    teacher: str | Path | None = None,
    model: str | Path | None = None,
    cache_dir: str | Path | None = None,
    previous: Sequence[FinishedStage] = (),
    context: type[StageContext] = StageContext,
) -> StageContext:
    """The context a stage handler (or an algorithm it calls, e.g. ``distill_model``) runs in: stage
    ``index`` of ``recipe`` writing into ``out_dir``, its splits loaded, cache in ``<parent>/.cache``."""
    from compress.data import load_recipe_split
    from compress.model_folder import check_model_folder
    from compress.models import resolve_teacher
    from compress.recipe_base import recipe_dir

    out = Path(out_dir).expanduser().resolve()
    teacher_dir = Path(teacher).resolve() if teacher else resolve_teacher(recipe.teacher, recipe_dir(recipe))
    input_dir = Path(model).resolve() if model else teacher_dir
    for folder in {teacher_dir, input_dir}:
        check_model_folder(folder, allow_pickle=recipe.teacher.allow_pickle)
    splits = {
        name: load_recipe_split(recipe, name) for name in SPLITS if getattr(recipe.data, name) is not None
    }
    return context(
        recipe=recipe,
        config=config if config is not None else recipe.stages[index - 1],
        index=index,
        out_dir=out,
        run_dir=out.parent,
        teacher_dir=teacher_dir,
        input_dir=input_dir,
        previous=list(previous),
        cache_dir=Path(cache_dir).resolve() if cache_dir else out.parent / CACHE_DIR,
        seed=recipe.seed,
        _splits=splits,
    )


def _execute(ctx: StageContext) -> Output:
    """Run the context's stage into its ``out_dir`` with the manifest a run folder's stage gets.

    On a non-main process of a data-parallel run (``RANK`` > 0) the handler runs (it takes part in
    training) but nothing is written: the main process writes the folder."""
    from compress.io import sha256_json
    from compress.models import folder_weights_sha
    from compress.pipeline import _run_stage, data_identity, stage_hash
    from compress.stages import get_stage

    spec = get_stage(ctx.config.type)
    if int(os.environ.get("RANK", "0")) > 0:
        result = spec.run(ctx)
        return Output(ctx.config.type, ctx.out_dir, ctx.input_dir, result.metrics, result.info, None)
    upstream = sha256_json(
        {"teacher": folder_weights_sha(ctx.teacher_dir), "input": folder_weights_sha(ctx.input_dir)}
    )
    data = data_identity(ctx.recipe)
    config_hash = stage_hash(ctx.config, upstream, ctx.recipe, data)
    inputs = {
        "upstream": upstream,
        "input_dir": str(ctx.input_dir),
        "teacher_dir": str(ctx.teacher_dir),
        "data": data,
    }
    folder = ctx.out_dir
    manifest = _run_stage(spec, folder, ctx, config_hash, inputs)
    return Output(ctx.config.type, folder, ctx.input_dir, manifest["metrics"], manifest["info"], manifest)


def _call(
    stage: str,
    options: Any,
    out_dir: str | Path,
    *,
    model: Any,
    data: Any,
    teacher: Any = None,
    needed: tuple[str, ...] = ("train", "eval"),
    task: Any = None,
    targets: Sequence[str] = (),
    seed: int = 0,
    cache_dir: str | Path | None = None,
    previous: Sequence[FinishedStage] = (),
) -> Output:
    """Validate the call as a one-stage recipe, then run that stage like ``run_stage``; ``teacher``
    defaults to ``model``."""
    from compress.stages import get_stage

    config = _options(get_stage(stage).config_cls, stage, options)
    out = Path(out_dir).expanduser().resolve()
    cache = Path(cache_dir).resolve() if cache_dir else out.parent / CACHE_DIR
    with contextlib.ExitStack() as stack:
        input_dir = stack.enter_context(_model_dir(model))
        teacher_dir = input_dir if teacher is None else stack.enter_context(_model_dir(teacher))
        spec = _task(task)
        splits = _split_sources(data, needed, spec, cache / "data")
        recipe = _recipe(stage, config, teacher_dir, spec, splits, list(targets), seed)
        ctx = stage_context(
            recipe,
            out,
            config=recipe.stages[0],
            teacher=teacher_dir,
            model=input_dir,
            cache_dir=cache,
            previous=previous,
            context=_CallContext,
        )
        return _execute(ctx)


def _options(config_cls: Any, stage: str, options: Any) -> Any:
    """A stage's options as its config class, validated as a recipe's stage is."""
    from pydantic import ValidationError

    from compress.config import validation_error_line

    if isinstance(options, config_cls):
        return options
    if not isinstance(options, Mapping):
        raise RecipeError(
            f"{stage} options: expected a dict or a {config_cls.__name__}, got {type(options).__name__}"
        )
    values = {"type": stage, **options}
    try:
        return config_cls.model_validate(values)
    except ValidationError as exc:
        raise RecipeError(validation_error_line(f"{stage} options", {}, exc, values)) from None


def _task(task: Any) -> dict[str, Any]:
    from compress.recipe_base import TaskConfig

    if task is None:
        return {}
    if isinstance(task, TaskConfig):
        return task.model_dump(exclude_unset=True)
    if isinstance(task, Mapping):
        return dict(task)
    raise RecipeError(f"task: expected a dict or a TaskConfig, got {type(task).__name__}")


def _split_sources(data: Any, needed: tuple[str, ...], task: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The recipe's ``data`` section: each split's source, in-memory rows written as JSONL files."""
    if isinstance(data, Mapping) and data and set(data) <= set(SPLITS):
        missing = [name for name in needed if name not in data]
        if missing:
            raise DataError(
                f"data: no '{missing[0]}' split; give {{'{missing[0]}': file or rows, ...}} "
                "or one source for every split"
            )
        given = {name: data[name] for name in SPLITS if name in data}
    else:
        given = dict.fromkeys(needed, data)
    given.setdefault("train", given["eval"])  # the recipe needs one; only distill, share and static read it
    return {name: _source_spec(name, source, task, folder) for name, source in given.items()}


def _source_spec(name: str, source: Any, task: dict[str, Any], folder: Path) -> dict[str, Any]:
    if isinstance(source, (str, Path)):
        return {"path": str(Path(source).expanduser().resolve())}
    if isinstance(source, Mapping):
        return dict(source)
    if isinstance(source, Sequence):
        return {"path": str(_rows_file(name, source, task, folder))}
    raise DataError(
        f"data['{name}']: expected a file path, a data-source dict or rows of (text, label), "
        f"got {type(source).__name__}"
    )


def _rows_file(name: str, rows: Sequence[Any], task: dict[str, Any], folder: Path) -> Path:
    """Write in-memory rows as JSONL under the task's column names (adding ``text_pair`` for pairs)."""
    from compress.io import sha256_json, write_text_atomic

    if not rows:
        raise DataError(f"data['{name}']: no rows; give at least one (text, label)")
    widths = set()
    for number, row in enumerate(rows, 1):
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or len(row) not in (2, 3):
            raise DataError(
                f"data['{name}'] row {number}: expected (text, label) or (text, pair, label), got {row!r:.80}"
            )
        widths.add(len(row))
    if len(widths) > 1:
        raise DataError(f"data['{name}']: rows mix (text, label) and (text, pair, label); use one shape")
    pairs = widths == {3}
    if pairs and not task.get("text_pair"):
        task["text_pair"] = "text_pair"
    if not pairs and task.get("text_pair"):
        raise DataError(f"data['{name}']: task.text_pair is set, so each row needs (text, pair, label)")
    columns = [task.get("text", "text"), *([task["text_pair"]] if pairs else []), task.get("label", "label")]
    lines = [json.dumps(dict(zip(columns, row, strict=True)), ensure_ascii=False) for row in rows]
    path = folder / f"{name}-{sha256_json(lines)[:16]}.jsonl"
    if not path.is_file():
        write_text_atomic(path, "\n".join(lines) + "\n")
    return path


def _file_split(path: Path, task: dict[str, Any], label_names: list[str], source: Mapping[str, Any]) -> Any:
    from compress.data import load_file

    return load_file(
        path,
        text=task.get("text", "text"),
        text_pair=task.get("text_pair"),
        label=task.get("label", "label"),
        label_names=label_names,
        fmt=source.get("format"),
    )


def _recipe(
    stage: str,
    config: Any,
    teacher_dir: Path,
    task: dict[str, Any],
    data: dict[str, Any],
    targets: list[str],
    seed: int,
) -> Any:
    """The one-stage recipe the call stands for, validated as a YAML recipe is."""
    from pydantic import ValidationError

    from compress.config import validation_error_line
    from compress.recipe import recipe_model

    values = {
        "name": f"api-{stage}",
        "seed": seed,
        "task": task,
        "teacher": {"path": str(teacher_dir)},
        "data": data,
        "targets": targets,
        "evaluate": {"enabled": False},
        "stages": [config],
    }
    try:
        return recipe_model().model_validate(values)
    except ValidationError as exc:
        raise RecipeError(validation_error_line(f"compress.api.{stage}()", {}, exc, values)) from None


@contextlib.contextmanager
def _model_dir(model: Any) -> Iterator[Path]:
    """A model's folder: a path, an ``Output``'s folder, or a ``(model, tokenizer)`` saved for the call."""
    if isinstance(model, Output):
        yield model.dir
    elif isinstance(model, (str, Path)):
        yield Path(model).expanduser().resolve()
    elif isinstance(model, tuple) and len(model) == 2 and hasattr(model[0], "save_pretrained"):
        from compress.models import save_checkpoint

        with tempfile.TemporaryDirectory(prefix="compress-api-model-") as tmp:
            save_checkpoint(model[0], model[1], Path(tmp))
            yield Path(tmp)
    else:
        raise ModelError(
            f"expected a model folder, an Output or a (model, tokenizer) pair, got {type(model).__name__}"
        )


def _export_folder(model: Any) -> tuple[Path, Path, dict[str, Any]] | None:
    """(folder, the checkpoint it was exported from, manifest) if ``model`` is an export's output."""
    from compress.io import read_json

    if isinstance(model, Output):
        folder = model.dir
    elif isinstance(model, (str, Path)):
        folder = Path(model).expanduser().resolve()
    else:
        return None
    path = folder / MANIFEST_FILE
    if not path.is_file():
        return None
    manifest = read_json(path)
    if not isinstance(manifest, dict) or manifest.get("stage") != "export":
        return None
    stored = Path(manifest.get("inputs", {}).get("input_dir", ""))
    source = stored if stored.is_absolute() else folder.parent / stored  # a run stores run-relative paths
    return folder, source, manifest


def _artifact_targets(folder: Path) -> list[str]:
    from compress.subjects import read_artifact_manifest

    return [
        t for p in sorted(folder.glob("*/manifest.json")) if (t := read_artifact_manifest(p.parent).target)
    ]


def _evaluated_folder(model: Any) -> Path:
    if isinstance(model, Output):
        if model.stage not in ("export", "quantize"):
            return model.dir
        if len(model.artifacts) != 1:
            names = [p.name for p in model.artifacts]
            raise ModelError(
                f"{model.dir}: holds {len(names)} artifacts {names}; evaluate one of output.artifacts"
            )
        return model.artifacts[0]
    if isinstance(model, (str, Path)):
        return Path(model).expanduser()
    raise ModelError(
        f"evaluate: expected an artifact or checkpoint folder or an Output, got {type(model).__name__}"
    )
