"""A run folder describes itself: after `compress run --set ...`, editing or deleting the recipe file or
moving the run folder leaves `compress report`, `gate` and `bundle` on it with the same results, because
they read the run's plan.json (the recipe as it ran) and never the recipe file."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner, Result

from compress.cli import main
from compress.io import sha256_file, write_json_atomic
from tests.helpers.tiny import write_recipe, write_reviews

TARGET = "arm64-onnx"
STAGES = "  - type: finetune\n    epochs: 1\n  - type: export\n"
EVALUATE = "evaluate: {latency_samples: 3, warmup: 1, throughput_batch: 4}"
GATES = f"targets: [{TARGET}]\n{EVALUATE}\ngates: {{max_bytes: 100000000, min_accuracy: 0.0}}\n"
OVERRIDES = ("evaluate.split=eval", "gates.max_bytes=1000")
"""Both change what the report says: the split it measures and a gate that now fails."""


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(result: Result, *needles: str) -> str:
    """The command failed with exit 2 and one ``error:`` line (no traceback) naming every needle."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert all(needle in lines[0] for needle in needles), lines[0]
    return lines[0]


def outcome(report: dict[str, Any]) -> dict[str, Any]:
    """What a report says about the run, without where the folder is or what the clock measured."""

    def entry(e: dict[str, Any]) -> dict[str, Any]:
        kept = {k: e.get(k) for k in ("name", "role", "format", "target", "precision", "bytes", "sha256")}
        metrics = e["metrics"]
        return {**kept, "predictions": e.get("predictions"), "accuracy": metrics["accuracy"]} | {
            "agreement": metrics.get("agreement")
        }

    return {
        "split": report["split"],
        "data": {k: report["data"][k] for k in ("source", "sha256", "rows", "labels")},
        "teacher": entry(report["teacher"]),
        "checkpoints": [entry(e) for e in report["checkpoints"]],
        "artifacts": [entry(e) for e in report["artifacts"]],
        "gates_config": report["gates_config"],
        "gates": sorted(
            (g["gate"], g["artifact"], g["verdict"]) for g in report["gates"] if "latency" not in g["gate"]
        ),
    }


def reevaluated(run: Path) -> dict[str, Any]:
    """`compress report` on a run without report.json evaluates it again, from what the run folder says."""
    (run / "report.json").unlink()
    result = cli("report", run)
    assert result.exit_code == 0, result.output
    return json.loads((run / "report.json").read_text())


def bundle_contents(path: Path) -> dict[str, bytes]:
    """The bundle's files; its manifest without the artifact's absolute path and without the model card
    (which quotes the latency measured by the report it was made with)."""
    with tarfile.open(path) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers()}
    manifest = json.loads(files.pop("manifest.json"))
    manifest.pop("source")
    manifest["files"] = [f for f in manifest["files"] if f["path"] != "README.md"]
    files.pop("README.md")
    return {**files, "manifest.json": json.dumps(manifest, sort_keys=True).encode()}


def gate_verdicts(report_file: Path, junit: Path) -> tuple[int, list[tuple[str, str]]]:
    import xml.etree.ElementTree as ET

    result = cli("gate", report_file, "--junit", junit)
    cases = ET.parse(junit).getroot().iter("testcase")
    kinds = [(c.get("classname"), c.get("name")) for c in cases if c.find("failure") is not None]
    return result.exit_code, sorted(kinds)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, tiny_bert_dir: Path) -> SimpleNamespace:
    """One `compress run` with --set overrides, shared by the tests below (each copies what it changes)."""
    import logging

    root = tmp_path_factory.mktemp("portable")
    cwd, ours = Path.cwd(), logging.getLogger("compress")
    saved = (list(ours.handlers), ours.level, ours.propagate)  # `compress` (main) replaces them
    os.chdir(root)  # the function-scoped fixture that keeps tests out of the repository runs later
    try:
        data = write_reviews(root / "data")
        recipe = write_recipe(root / "r.yaml", teacher=tiny_bert_dir, data=data, stages=STAGES, extra=GATES)
        sets = [arg for override in OVERRIDES for arg in ("--set", override)]
        result = cli("run", recipe, "--out", root / "runs", *sets)
        assert result.exit_code == 1, result.output  # the overridden max_bytes gate fails
        run = root / "runs" / "tiny"
        report = json.loads((run / "report.json").read_text())
        bundle = cli("bundle", run, "--target", TARGET, "-o", root / "before.tar.gz")
        assert bundle.exit_code == 0, bundle.output
        gate = gate_verdicts(run / "report.json", root / "before.xml")
    finally:
        os.chdir(cwd)
        ours.handlers[:], ours.propagate = saved[0], saved[2]
        ours.setLevel(saved[1])
    return SimpleNamespace(
        root=root, run=run, recipe=recipe, data=data, report=report, gate=gate, teacher=tiny_bert_dir
    )


def copy_of(made: SimpleNamespace, tmp_path: Path) -> Path:
    copy = tmp_path / "elsewhere" / "tiny"
    shutil.copytree(made.run, copy)
    return copy


def test_the_plan_records_the_recipe_as_it_ran(made):
    plan = json.loads((made.run / "plan.json").read_text())
    run_file = json.loads((made.run / "run.json").read_text())
    assert plan["schema"] == "compress.plan/1" and plan["overrides"] == list(OVERRIDES)
    assert plan["recipe"]["evaluate"]["split"] == "eval" and plan["recipe"]["gates"]["max_bytes"] == 1000
    assert plan["recipe"]["evaluate"]["throughput_batch"] == 4 and plan["recipe"]["seed"] == 0  # defaults
    assert plan["recipe"]["data"]["eval"]["path"] == str(made.data["dev"].resolve())
    assert plan["data"]["eval"] == {
        "path": str(made.data["dev"].resolve()),
        "sha256": sha256_file(made.data["dev"]),
    }
    assert plan["teacher"]["source"] == "path" and plan["teacher"]["id"] == str(made.teacher.resolve())
    assert plan["targets"][TARGET]["profile"]["name"] == TARGET
    assert [s["dir"] for s in plan["stages"]] == ["01-finetune", "02-export"]
    assert run_file["teacher_dir"] == "01-finetune"  # the finetuned teacher, inside the run folder
    assert run_file["plan_sha256"] == sha256_file(made.run / "plan.json")
    assert made.report["split"] == "eval"
    assert ("max_bytes", f"02-export/{TARGET}-fp32", "fail") in outcome(made.report)["gates"]


def test_report_gate_and_bundle_ignore_an_edited_or_deleted_recipe_and_a_moved_run(made, tmp_path):
    write_recipe(made.recipe, teacher=made.teacher, data=made.data, stages=STAGES, extra=EVALUATE)
    run = copy_of(made, tmp_path)  # (a) the recipe file edited: no gates, the test split
    assert outcome(reevaluated(run)) == outcome(made.report)

    made.recipe.unlink()  # (b) deleted, and (c) the run folder moved to another directory
    moved = tmp_path / "moved" / "tiny"
    moved.parent.mkdir()
    shutil.move(run, moved)
    report = reevaluated(moved)
    assert outcome(report) == outcome(made.report)
    assert report["run"] == str(moved.resolve())
    assert all(Path(a["path"]).is_relative_to(moved.resolve()) for a in report["artifacts"])
    assert gate_verdicts(moved / "report.json", tmp_path / "after.xml") == made.gate
    result = cli("bundle", moved, "--target", TARGET, "-o", tmp_path / "after.tar.gz")
    assert result.exit_code == 0, result.output
    assert bundle_contents(tmp_path / "after.tar.gz") == bundle_contents(made.root / "before.tar.gz")


def test_a_moved_report_json_is_rewritten_for_its_new_folder(made, tmp_path):
    run = copy_of(made, tmp_path)
    result = cli("report", run)
    assert result.exit_code == 0, result.output
    report = json.loads((run / "report.json").read_text())
    assert report["run"] == str(run.resolve()) and outcome(report) == outcome(made.report)
    [artifact] = report["artifacts"]
    assert Path(artifact["path"]) == run.resolve() / "02-export" / f"{TARGET}-fp32"
    assert (Path(artifact["path"]) / "README.md").is_file()


def test_verify_arm_reads_the_eval_split_and_tolerance_from_the_plan(made, tmp_path):
    from compress.cli_deploy import _texts, recipe_min_agreement

    run = copy_of(made, tmp_path)
    texts, pairs, source = _texts(run, None)
    rows = made.data["dev"].read_text().splitlines()[1:]
    assert texts == [row.split("\t")[0] for row in rows] and pairs is None
    assert str(made.data["dev"].resolve()) in source
    assert recipe_min_agreement(run) is None  # no quantize stage


def _tamper(run: Path, edit) -> None:
    plan = json.loads((run / "plan.json").read_text())
    edit(plan)
    write_json_atomic(run / "plan.json", plan)


@pytest.mark.parametrize(
    ("case", "needles"),
    [
        ("truncated", ("plan.json",)),
        ("edited", ("plan.json", "changed since the run wrote it", "compress run RECIPE")),
        ("invalid-recipe", ("plan.json: recipe: evaluate.bogus", "compress run RECIPE")),
        ("invalid-teacher", ("plan.json: teacher.sha256", "compress run RECIPE")),
        ("missing", ("plan.json: missing", "compress run RECIPE")),
    ],
)
def test_a_tampered_or_invalid_plan_is_one_line(made, tmp_path, case, needles):
    run = copy_of(made, tmp_path)
    plan_file = run / "plan.json"
    if case == "truncated":
        plan_file.write_text(plan_file.read_text()[:50])
    elif case == "edited":
        _tamper(run, lambda plan: plan["recipe"]["evaluate"].update(split="test"))
    elif case == "missing":
        plan_file.unlink()
    else:  # invalid and consistent: run.json names the tampered file's hash
        if case == "invalid-recipe":
            _tamper(run, lambda plan: plan["recipe"]["evaluate"].update(bogus=1))
        else:
            _tamper(run, lambda plan: plan["teacher"].update(sha256="not a hash"))
        run_file = json.loads((run / "run.json").read_text())
        write_json_atomic(run / "run.json", {**run_file, "plan_sha256": sha256_file(plan_file)})
    (run / "report.json").unlink()
    one_line_error(cli("report", run), *needles)
    one_line_error(cli("bundle", run, "--target", TARGET), *needles)


def test_changed_or_missing_data_is_one_line_naming_the_file(made, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(made.data["dev"].parent, data)
    run = copy_of(made, tmp_path)

    def point_at(folder: Path) -> None:
        def edit(plan: dict[str, Any]) -> None:
            for split, name in (("train", "train"), ("eval", "dev"), ("test", "test")):
                path = str((folder / f"{name}.tsv").resolve())
                plan["recipe"]["data"][split]["path"] = plan["data"][split]["path"] = path

        _tamper(run, edit)
        run_file = json.loads((run / "run.json").read_text())
        write_json_atomic(run / "run.json", {**run_file, "plan_sha256": sha256_file(run / "plan.json")})

    point_at(data)
    (run / "report.json").unlink()
    (data / "dev.tsv").write_text((data / "dev.tsv").read_text() + "a very good film\t1\n")
    one_line_error(
        cli("report", run), str((data / "dev.tsv").resolve()), "changed since the run", "data.eval"
    )
    (data / "dev.tsv").unlink()
    one_line_error(cli("report", run), str((data / "dev.tsv").resolve()), "data.eval", "compress run RECIPE")


def test_a_run_without_a_plan_reads_its_recipe_file_as_before(made, tmp_path, caplog):
    """A run folder an older compress made (run.json has no plan_sha256, no plan.json)."""
    from compress.errors import CompressError
    from compress.subjects import recipe_of_run

    run = copy_of(made, tmp_path)
    recipe = tmp_path / "old.yaml"
    write_recipe(recipe, teacher=made.teacher, data=made.data, stages=STAGES, extra=GATES)
    (run / "plan.json").unlink()
    run_file = json.loads((run / "run.json").read_text())
    run_file.pop("plan_sha256")
    write_json_atomic(run / "run.json", {**run_file, "recipe_file": str(recipe)})
    assert recipe_of_run(run).evaluate.split is None  # the file's, without the run's --set
    assert "without plan.json" in caplog.text
    recipe.unlink()
    with pytest.raises(CompressError, match=r"old\.yaml: file not found"):
        recipe_of_run(run)


def test_a_changed_or_missing_recipe_teacher_is_one_line(tmp_path, tiny_bert_dir, reviews):
    """A run whose teacher is the recipe's (no finetune stage) checks it is the folder the run hashed."""
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_bert_dir, teacher)
    stages = "  - type: export\n"
    recipe = write_recipe(
        tmp_path / "r.yaml", teacher=teacher, data=reviews, stages=stages, extra=f"targets: [{TARGET}]"
    )
    assert cli("run", recipe, "--out", tmp_path / "runs").exit_code == 0
    run = tmp_path / "runs" / "tiny"
    plan = json.loads((run / "plan.json").read_text())
    assert plan["teacher"]["dir"] == str(teacher.resolve())
    assert json.loads((run / "run.json").read_text())["teacher_dir"] == str(teacher.resolve())
    assert cli("bundle", run, "--target", TARGET).exit_code == 0

    config = json.loads((teacher / "config.json").read_text())
    (teacher / "config.json").write_text(json.dumps({**config, "id2label": {"0": "no", "1": "yes"}}))
    one_line_error(cli("bundle", run, "--target", TARGET), "plan.json: teacher", "changed since the run")
    shutil.rmtree(teacher)
    one_line_error(cli("bundle", run, "--target", TARGET), "plan.json: teacher", "is gone", "compress run")
