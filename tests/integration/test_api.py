"""The Python API on the tiny fixtures: README's example runs as written and leaves real artifacts whose
numbers match ``compress eval``; in-memory rows evaluate as their file does; a bad option is the
recipe's one-line error and leaves no folder behind."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from compress import api
from compress.errors import DataError, RecipeError
from compress.recipe import load_recipe
from tests.conftest import REPO
from tests.helpers.tiny import make_tiny_bert, write_recipe, write_reviews


def readme_example() -> str:
    """The fenced Python block of README's "Python API" section, as a reader copies it."""
    section = (REPO / "README.md").read_text().split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> tuple[Path, dict]:
    """README's example run in a folder holding what it names: models/teacher and data/*.tsv."""
    root = tmp_path_factory.mktemp("api")
    make_tiny_bert(root / "models" / "teacher", layers=6)
    write_reviews(root / "data")
    namespace: dict = {}
    before = Path.cwd()
    os.chdir(root)
    try:
        exec(compile(readme_example(), "README.md", "exec"), namespace)
    finally:
        os.chdir(before)
    return root, namespace


def test_readme_example_writes_artifacts_that_predict_as_compress_eval_says(example):
    import numpy as np
    import onnxruntime as ort

    from compress.cli import main
    from compress.data import load_file
    from compress.runtime.runner import load

    root, ns = example
    student, int8, result = ns["student"], ns["int8"], ns["result"]
    assert student.manifest["stage"] == "distill" and student.manifest["complete"] is True
    assert json.loads((student.dir / "manifest.json").read_text()) == json.loads(json.dumps(student.manifest))
    assert student.metrics["parameters"] < student.metrics["source_parameters"]
    [artifact] = int8.artifacts
    assert artifact == root / "runs" / "api" / "int8" / "arm64-onnx-int8"
    ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
    test = load_file(root / "data" / "test.tsv", text="sentence")
    predicted = load(artifact).predict_logits(test.texts).argmax(-1).tolist()
    entry = result.result["artifacts"][0]
    assert entry["predictions"] == predicted
    assert result.metrics["accuracy"] == pytest.approx(float(np.mean(np.array(predicted) == test.labels)))
    cli_json = root / "cli-eval.json"
    args = ["eval", str(artifact), "--data", str(root / "data" / "test.tsv"), "--text", "sentence"]
    done = CliRunner().invoke(main, [*args, "--json", str(cli_json)])
    assert done.exit_code == 0, done.output
    [cli_entry] = json.loads(cli_json.read_text())["artifacts"]
    assert cli_entry["predictions"] == predicted
    assert cli_entry["metrics"]["accuracy"] == result.metrics["accuracy"]
    assert cli_entry["sha256"] == entry["sha256"]


def test_in_memory_rows_evaluate_as_their_file_does(example):
    from compress.data import load_file

    root, ns = example
    test = load_file(root / "data" / "test.tsv", text="sentence")
    rows = list(zip(test.texts, test.labels, strict=True))
    got = api.evaluate(ns["int8"], rows, latency_samples=3, warmup=0)
    assert got.result["artifacts"][0]["predictions"] == ns["result"].result["artifacts"][0]["predictions"]
    assert got.metrics["accuracy"] == ns["result"].metrics["accuracy"]


def test_a_bad_option_is_the_recipes_one_line_error_and_writes_nothing(example, tmp_path):
    root, _ = example
    teacher, data = root / "models" / "teacher", write_reviews(tmp_path / "data")
    splits = {"train": data["train"], "eval": data["dev"]}
    task = {"text": "sentence"}
    recipe = write_recipe(
        tmp_path / "r.yaml", teacher=teacher, data=data, stages="  - type: distill\n    epochs: 0\n"
    )
    with pytest.raises(RecipeError) as from_recipe:
        load_recipe(recipe)
    with pytest.raises(RecipeError) as from_api:
        api.distill(teacher, splits, {"epochs": 0}, tmp_path / "student", task=task)
    assert str(from_api.value) == "distill options epochs: must be > 0, got 0"
    assert str(from_recipe.value).endswith("stages[0].epochs: must be > 0, got 0")
    with pytest.raises(RecipeError, match=r"^distill options\.layers: 9 is more than the teacher's 6 layers"):
        api.distill(teacher, splits, {"layers": 9}, tmp_path / "student", task=task)
    with pytest.raises(DataError, match=r"^data\['eval'\] row 2: expected \(text, label\) or"):
        api.distill(teacher, {"train": data["train"], "eval": [("good", 1), "bad"]}, {}, tmp_path / "student")
    assert not (tmp_path / "student").exists()


def test_share_takes_a_previous_output_and_run_applies_mapping_overrides(example, tmp_path):
    from compress.models import load_classifier

    root, ns = example
    data = {"train": root / "data" / "train.tsv", "eval": root / "data" / "dev.tsv"}
    shared = api.share(
        ns["student"], data, {"vocab": {}, "recovery": None}, tmp_path / "shared", task=ns["task"]
    )
    assert shared.metrics["parameters"] < shared.metrics["parameters_before"]
    assert shared.manifest["stage"] == "share" and shared.source == ns["student"].dir
    model, tokenizer = load_classifier(shared.dir)
    assert len(tokenizer) == model.config.vocab_size
    recipe = write_recipe(
        tmp_path / "r.yaml",
        teacher=root / "models" / "teacher",
        data={"train": data["train"], "dev": data["eval"], "test": data["eval"]},
        stages="  - type: distill\n",
    )
    with pytest.raises(RecipeError, match=r"r\.yaml(:\d+)? stages\[0\]\.epochs: must be > 0, got 0$"):
        api.run(recipe, {"stages.0.epochs": 0}, out=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()
    done = api.run(recipe, {"stages.0.epochs": 1}, out=tmp_path / "runs")
    plan = json.loads((done.run_dir / "plan.json").read_text())
    assert plan["overrides"] == ["stages.0.epochs=1"] and plan["recipe"]["stages"][0]["epochs"] == 1
