"""Property-based fuzzing of every JSON file compress reads back: valid, or one error line, never a traceback.

Each reader gets three kinds of damage to a document compress itself writes: a random truncation,
one field replaced by an arbitrary JSON value (a type swap, a missing key, an extra key) and a
field replaced by a deeply nested list. Where a reader hands its result on (a report to the gates
and the Markdown renderer, a run.json to the recipe and teacher lookups), the property covers the
consumer too: whatever the reader accepts must be usable.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compress.errors import CompressError
from compress.metrics import paired_accuracy_interval
from compress.runtime import runner
from tests.helpers.fuzz import documents

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SHA = "ab" * 32

json_values = documents(text_size=12, branch=3, leaves=8)


def report_doc() -> dict[str, Any]:
    artifact = {
        "name": "02-export/arm64-onnx",
        "role": "artifact",
        "format": "onnx",
        "target": "arm64-onnx",
        "precision": "int8",
        "bytes": 1000,
        "sha256": SHA,
        "metrics": {"accuracy": 0.5, "agreement": 0.9, "latency_ms": {"p50": 1.0, "p90": 2.0}},
        "measured": {"machine": "x86_64", "runtime": "onnxruntime", "threads": 1},
        "budgets": {"max_bytes": 5000},
        "predictions": [0, 0],
    }
    artifact["metrics"]["accuracy_vs_teacher"] = paired_accuracy_interval([0, 0], [0, 1], [0, 1], resamples=5)
    teacher = {
        "name": "teacher",
        "role": "teacher",
        "format": "torch",
        "bytes": 4000,
        "metrics": {"accuracy": 0.9},
        "predictions": [0, 1],
    }
    return {
        "schema": "compress.report/1",
        "run": "runs/tiny",
        "data": {"labels": ["neg", "pos"], "rows": 2, "gold": [0, 1]},
        "teacher": teacher,
        "checkpoints": [],
        "artifacts": [artifact],
        "device_results": [
            {
                "artifact": "02-export/arm64-onnx",
                "where": "device",
                "machine": "aarch64",
                "runtime": "onnxruntime 1",
                "latency_ms": {"p50": 3.0},
            }
        ],
        "gates_config": {"min_accuracy": 0.4, "baseline": {"max_bytes_rise": 0.1}},
        "gates": [
            {
                "gate": "min_accuracy",
                "artifact": "02-export/arm64-onnx",
                "value": 0.5,
                "threshold": 0.4,
                "verdict": "pass",
                "detail": "",
            }
        ],
    }


def device_doc() -> dict[str, Any]:
    return {
        "schema": "compress.device-benchmark/1",
        "model_sha256": SHA,
        "device": {"machine": "aarch64", "cpu_model": "Cortex-A72"},
        "interpreter": {"name": "onnxruntime", "version": "1.20"},
        "threads": 4,
        "latency_ms": {"p50": 3.0, "p90": 4.0},
    }


def run_doc(recipe: Path, teacher: Path) -> dict[str, Any]:
    return {
        "schema": "compress.run/1",
        "recipe": "tiny",
        "recipe_file": str(recipe),
        "teacher_dir": str(teacher),
        "teacher_load": {"allow_pickle": False},
        "stages": [{"index": 1, "type": "export", "dir": "01-export"}],
    }


def artifact_doc() -> dict[str, Any]:
    return {
        "kind": "artifact",
        "name": "02-export/arm64-onnx",
        "format": "onnx",
        "target": "arm64-onnx",
        "precision": "int8",
        "max_length": 16,
        "threads": 2,
        "task": {"text_pair": False},
        "files": [
            {"path": "model.onnx", "sha256": SHA, "bytes": 3},
            {"path": "tokenizer.json", "sha256": SHA, "bytes": 3},
            {"path": "labels.json", "sha256": SHA, "bytes": 3},
        ],
    }


def config_doc() -> dict[str, Any]:
    return {"model_type": "bert", "id2label": {"0": "neg", "1": "pos"}, "max_position_embeddings": 128}


def paths_of(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path in a document, so a swap can hit any field at any depth."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += paths_of(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            out += paths_of(value, (*prefix, index))
    return out


def swapped(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def removed(doc: Any, path: tuple[Any, ...]) -> Any:
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return doc


def one_line_or_valid(
    call: Callable[[], Any], errors: tuple[type[BaseException], ...] = (CompressError,)
) -> None:
    try:
        call()
    except errors as exc:
        message = str(exc)
        assert message and "\n" not in message, repr(message)


# -- the readers: each takes the folder holding the damaged file ------------------------------------


def read_report(folder: Path) -> None:
    from compress.gate import check_report_file
    from compress.report import load_report
    from compress.report_render import markdown

    markdown(load_report(folder / "report.json", shown=True))
    check_report_file(folder / "report.json")


def read_baseline(folder: Path) -> None:
    from compress.gate import check_report_file

    (folder / "current.json").write_text(json.dumps(report_doc()))
    check_report_file(folder / "current.json", folder / "report.json")


def read_device(folder: Path) -> None:
    from compress.report import merge_device_results
    from compress.report_render import markdown

    report = report_doc()
    merge_device_results(report, folder / "device.json")
    markdown(report)


def read_run(folder: Path) -> None:
    from compress.subjects import _stage_folders, _teacher_load_options, recipe_of_run

    _stage_folders(folder, None)
    _teacher_load_options(folder, None)
    recipe_of_run(folder)


def read_stage(folder: Path) -> None:
    from compress.subjects import read_stage_manifest

    read_stage_manifest(folder)


def read_artifact(folder: Path) -> None:
    from compress.bundle import bundle_files
    from compress.subjects import subject_at

    (folder / "labels.json").write_text('["neg", "pos"]')
    subject_at(folder)
    bundle_files(folder, 1, "b.tar.gz")


def read_config(folder: Path) -> None:
    from compress.errors import RecipeError
    from compress.recipe import position_limit
    from compress.subjects import label_names_of_config

    label_names_of_config(folder / "config.json")
    try:
        position_limit(folder / "config.json")
    except RecipeError as exc:
        assert "\n" not in str(exc)


def read_labels(folder: Path) -> None:
    from compress.subjects import read_labels as labels

    labels(folder / "labels.json")


def read_runner_manifest(folder: Path) -> None:
    runner.verify_files(folder, runner.read_manifest(folder))


def read_runner_labels(folder: Path) -> None:
    runner.read_labels(folder / "labels.json")


def read_jsonl(folder: Path) -> None:
    from compress.data import build_split, read_rows

    rows = read_rows(folder / "rows.jsonl", "jsonl")
    build_split(
        rows, where="rows.jsonl", text="text", text_pair=None, label="label", label_names=None, sha256="x"
    )


def _readers(
    tmp: Path,
) -> dict[str, tuple[str, Any, Callable[[Path], None], tuple[type[BaseException], ...]]]:
    """name -> (file name, valid document, reader, the one-line error types it may raise)."""
    recipe = tmp / "r.yaml"
    recipe.write_text("name: x\n")
    compress = (CompressError,)
    return {
        "report": ("report.json", report_doc(), read_report, compress),
        "baseline": ("report.json", report_doc(), read_baseline, compress),
        "device": ("device.json", device_doc(), read_device, compress),
        "run": ("run.json", run_doc(recipe, tmp), read_run, compress),
        "stage": (
            "manifest.json",
            {"schema": "compress.stage/1", "complete": True, "produces": "model"},
            read_stage,
            compress,
        ),
        "artifact": ("manifest.json", artifact_doc(), read_artifact, compress),
        "config": ("config.json", config_doc(), read_config, compress),
        "labels": ("labels.json", ["neg", "pos"], read_labels, compress),
        "runner-manifest": ("manifest.json", artifact_doc(), read_runner_manifest, (runner.RunnerError,)),
        "runner-labels": ("labels.json", ["neg", "pos"], read_runner_labels, (runner.RunnerError,)),
    }


READERS = [
    "report",
    "baseline",
    "device",
    "run",
    "stage",
    "artifact",
    "config",
    "labels",
    "runner-manifest",
    "runner-labels",
]


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8", errors="surrogatepass")
    return folder


def _case_folder(tmp: Path) -> Path:
    """A fresh folder per example (hypothesis reuses the function-scoped tmp_path)."""
    index = len(list(tmp.glob("case-*")))
    return tmp / f"case-{index}"


@pytest.mark.parametrize("reader", READERS)
@FUZZ
@given(data=st.data())
def test_truncated(tmp_path: Path, reader: str, data: st.DataObject):
    name, doc, read, errors = _readers(tmp_path)[reader]
    text = json.dumps(doc, indent=2)
    cut = data.draw(st.integers(min_value=0, max_value=len(text)))
    folder = _write(_case_folder(tmp_path), name, text[:cut])
    one_line_or_valid(lambda: read(folder), errors)


@pytest.mark.parametrize("reader", READERS)
@FUZZ
@given(data=st.data(), value=json_values)
def test_one_field_swapped(tmp_path: Path, reader: str, data: st.DataObject, value: Any):
    name, doc, read, errors = _readers(tmp_path)[reader]
    path = data.draw(st.sampled_from(paths_of(doc)))
    folder = _write(_case_folder(tmp_path), name, json.dumps(swapped(doc, path, value)))
    one_line_or_valid(lambda: read(folder), errors)


@pytest.mark.parametrize("reader", READERS)
@FUZZ
@given(data=st.data())
def test_one_field_removed(tmp_path: Path, reader: str, data: st.DataObject):
    name, doc, read, errors = _readers(tmp_path)[reader]
    path = data.draw(st.sampled_from(paths_of(doc)))
    folder = _write(_case_folder(tmp_path), name, json.dumps(removed(doc, path)))
    one_line_or_valid(lambda: read(folder), errors)


@pytest.mark.parametrize("reader", READERS)
@FUZZ
@given(data=st.data(), depth=st.integers(min_value=70, max_value=200_000))
def test_deep_nesting(tmp_path: Path, reader: str, data: st.DataObject, depth: int):
    """Nested past any reader's limit: always an error line (never RecursionError or a hang)."""
    name, doc, read, errors = _readers(tmp_path)[reader]
    path = data.draw(st.sampled_from(paths_of(doc)))
    marker = "__deep__"
    text = json.dumps(swapped(doc, path, marker)).replace(f'"{marker}"', "[" * depth + "]" * depth)
    folder = _write(_case_folder(tmp_path), name, text)
    with pytest.raises(errors) as caught:
        read(folder)
    assert "\n" not in str(caught.value)


@FUZZ
@given(lines=st.lists(json_values, min_size=1, max_size=4), cut=st.integers(min_value=0, max_value=400))
def test_jsonl_rows(tmp_path: Path, lines: list[Any], cut: int):
    """Data rows are JSON too: any values, truncated anywhere, give rows or one DataError line."""
    rows = [{"text": "a film", "label": value} if i % 2 else value for i, value in enumerate(lines)]
    text = "\n".join(json.dumps(row) for row in rows)
    folder = _write(_case_folder(tmp_path), "rows.jsonl", text[: max(cut, 1)])
    one_line_or_valid(lambda: read_jsonl(folder))


def _outcome(read: Callable[[Path], None], folder: Path, errors: tuple[type[BaseException], ...]) -> str:
    """What a reader made of a folder: "ok", or its error line with the folder's name taken out."""
    try:
        read(folder)
    except errors as exc:
        return str(exc).replace(str(folder), "FOLDER")
    return "ok"


@pytest.mark.parametrize("reader", [r for r in READERS if not r.endswith("labels")])  # labels are lists
def test_newer_minor_version_keys_change_nothing(tmp_path: Path, reader: str):
    """A key added by a newer compress (same schema version), at the top or inside an object, leaves
    the outcome exactly as it was: a document that reads still reads; one that fails for another
    reason (here: files the fixture does not hold) fails with the same line, not over the new key."""
    name, doc, read, errors = _readers(tmp_path)[reader]
    before = _outcome(read, _write(tmp_path / "base", name, json.dumps(doc)), errors)
    objects = [path for path in paths_of(doc) if isinstance(_at(doc, path), dict)]
    for index, path in enumerate([(), *objects]):
        node = _at(doc, path)
        if node and all(str(key).isdigit() for key in node):
            continue  # keyed by id (id2label): a name is not a newer key there, it is a wrong one
        values = list(node.values())
        # a record gains a field of any shape; a map of scalars (budgets, latency) an entry like the others
        scalar_map = bool(values) and all(not isinstance(v, dict | list) for v in values)
        added = copy.deepcopy(doc)
        _at(added, path)["added_by_a_newer_version"] = values[0] if scalar_map else {"nested": [1, 2]}
        folder = _write(tmp_path / f"added-{index}", name, json.dumps(added))
        assert _outcome(read, folder, errors) == before, path


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc
