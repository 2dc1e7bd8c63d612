"""Property-based fuzzing of the recipe and target loaders: any input is either valid or one RecipeError line.

Three sources of input: arbitrary text, arbitrary YAML-able structures, and a valid recipe or profile
with one field replaced by an arbitrary value (which reaches the validators behind the first key).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compress.errors import RecipeError
from compress.recipe import load_recipe
from compress.targets import load_target_file
from tests.helpers.fuzz import documents

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

values = documents(text_size=20, branch=4, leaves=12)
RECIPE_KEYS = [
    ["name"],
    ["seed"],
    ["task"],
    ["task", "max_length"],
    ["task", "labels"],
    ["teacher"],
    ["teacher", "path"],
    ["data", "train"],
    ["data", "eval", "path"],
    ["data", "train", "format"],
    ["data", "train", "columns"],
    ["targets"],
    ["gates"],
    ["gates", "baseline"],
    ["evaluate"],
    ["stages"],
    ["stages", 0],
    ["stages", 0, "type"],
    ["stages", 0, "epochs"],
    ["stages", 1, "layers"],
    ["stages", 1, "init"],
    ["stages", 1, "hidden"],
    ["stages", 1, "weights"],
    ["stages", 1, "mlm"],
    ["stages", 1, "augment"],
    ["stages", 2, "layers"],
    ["stages", 2, "vocab"],
    ["stages", 2, "recovery"],
]
TARGET_KEYS = [
    ["name"],
    ["format"],
    ["threads"],
    ["sequence_lengths"],
    ["quantization"],
    ["budgets"],
    ["opset"],
]


def base_recipe(folder: Path) -> dict[str, Any]:
    (folder / "train.tsv").write_text("sentence\tlabel\nok\t1\n")
    return {
        "name": "fuzz",
        "task": {"text": "sentence", "labels": ["negative", "positive"]},
        "teacher": {"path": str(folder)},
        "data": {"train": {"path": str(folder / "train.tsv")}, "eval": {"path": str(folder / "train.tsv")}},
        "stages": [
            {"type": "finetune", "epochs": 1},
            {"type": "distill", "layers": 1},
            {"type": "share", "embedding_rank": 8},
        ],
        "targets": ["arm64-onnx"],
        "gates": {"min_accuracy": 0.5, "baseline": {"max_accuracy_drop": 0.01}},
        "evaluate": {"latency_samples": 10},
    }


def base_target() -> dict[str, Any]:
    return {
        "name": "fuzz",
        "format": "onnx",
        "runtime": "onnxruntime",
        "sequence_lengths": [16],
        "input_dtype": "int64",
    }


def replace(data: Any, keys: list[str | int], value: Any) -> Any:
    node = data
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return data


def assert_one_line_or_valid(load, *args: Any) -> None:
    try:
        load(*args)
    except RecipeError as exc:
        message = str(exc)
        assert message and "\n" not in message, repr(message)


def write(folder: Path, text: str, name: str = "fuzz.yaml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


@FUZZ
@given(text=st.text(max_size=300))
def test_arbitrary_text_recipe(tmp_path: Path, text: str):
    assert_one_line_or_valid(load_recipe, write(tmp_path, text))


@FUZZ
@given(data=values)
def test_arbitrary_structure_recipe(tmp_path: Path, data: Any):
    assert_one_line_or_valid(load_recipe, write(tmp_path, yaml.safe_dump(data)))


@FUZZ
@given(keys=st.sampled_from(RECIPE_KEYS), value=values)
def test_valid_recipe_with_one_field_replaced(tmp_path: Path, keys: list[str | int], value: Any):
    data = replace(base_recipe(tmp_path), keys, value)
    assert_one_line_or_valid(load_recipe, write(tmp_path, yaml.safe_dump(data)))


@FUZZ
@given(override=st.text(max_size=40))
def test_arbitrary_set_override(tmp_path: Path, override: str):
    assert_one_line_or_valid(load_recipe, write(tmp_path, yaml.safe_dump(base_recipe(tmp_path))), [override])


@FUZZ
@given(text=st.text(max_size=300))
def test_arbitrary_text_target(tmp_path: Path, text: str):
    assert_one_line_or_valid(load_target_file, write(tmp_path, text))


@FUZZ
@given(data=values)
def test_arbitrary_structure_target(tmp_path: Path, data: Any):
    assert_one_line_or_valid(load_target_file, write(tmp_path, yaml.safe_dump(data)))


@FUZZ
@given(keys=st.sampled_from(TARGET_KEYS), value=values)
def test_valid_target_with_one_field_replaced(tmp_path: Path, keys: list[str], value: Any):
    data = replace(base_target(), keys, value)
    assert_one_line_or_valid(load_target_file, write(tmp_path, yaml.safe_dump(data)))


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("[" * 5000 + "]" * 5000, id="deep-nesting"),
        pytest.param(
            "a: &a [x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{k}: &{k} [{', '.join([f'*{p}'] * 9)}]\n"
                for p, k in zip("abcdefgh", "bcdefghi", strict=True)
            )
            + "name: *i\n",
            id="alias-bomb",
        ),
        pytest.param("name: \x00\n", id="nul-character"),
        pytest.param("\ufeffname: x\n", id="byte-order-mark"),
        pytest.param("? [a, b]\n: 1\n", id="list-as-key"),
        pytest.param("name: x\n...\n---\nname: y\n", id="two-documents"),
    ],
)
def test_hostile_yaml_is_one_line(tmp_path: Path, text: str):
    """The alias bomb expands to 9**9 leaves if anything walks it as a tree; it must not hang."""
    assert_one_line_or_valid(load_recipe, write(tmp_path, text))
    assert_one_line_or_valid(load_target_file, write(tmp_path, text))
