"""The distill stage end to end on a tiny model: a shallower student that tracks its teacher."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch

from compress.errors import RecipeError, TrainingError
from compress.io import read_json
from compress.models import load_classifier
from compress.pipeline import run_recipe
from compress.recipe import load_recipe
from compress.stages import get_stage
from compress.stages.base import StageResult
from tests.helpers.stages import stage_context
from tests.helpers.tiny import write_recipe, write_reviews

FINETUNE = "  - type: finetune\n    when: always\n    epochs: 10\n    batch_size: 16\n    lr: 3.0e-3\n"
DISTILL = """  - type: distill
    layers: 1
    epochs: {epochs}
    batch_size: 16
    lr: 3.0e-3
    patience: null
    weights: {weights}
    hidden: {{metric: {metric}, include_embeddings: true}}
{extra}"""


def handler_only(recipe_path: Path, work: Path, teacher: Path) -> tuple[StageResult, Path]:
    """Run a one-stage recipe's handler without the pipeline's final report (which measures latency)."""
    ctx = stage_context(recipe_path, work, teacher)
    return get_stage(ctx.recipe.stages[0].type).run(ctx), ctx.out_dir


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, tiny_bert_dir):
    """The tiny model fine-tuned once for the module: (teacher folder, data files)."""
    root = tmp_path_factory.mktemp("teacher")
    data = write_reviews(root / "data")
    recipe = write_recipe(root / "r.yaml", teacher=tiny_bert_dir, data=data, stages=FINETUNE)
    return handler_only(recipe, root / "work", tiny_bert_dir)[1], data


def recipe_file(tmp_path, teacher, **kw) -> Path:
    values = {
        "weights": "{soft: 1.0, hard: 0.5, hidden: 1.0}",
        "metric": "cosine",
        "extra": "",
        "epochs": 4,
        **kw,
    }
    stages = DISTILL.format(**values)
    return write_recipe(tmp_path / "r.yaml", teacher=teacher[0], data=teacher[1], stages=stages)


def run(tmp_path, teacher, **kw):
    return run_recipe(load_recipe(recipe_file(tmp_path, teacher, **kw)), tmp_path / "runs")


def stage(tmp_path, teacher, **kw) -> StageResult:
    return handler_only(recipe_file(tmp_path, teacher, **kw), tmp_path / "work", teacher[0])[0]


def test_distilled_student_keeps_the_teachers_accuracy(tmp_path, teacher):
    result = run(tmp_path, teacher)
    folder = result.stages[0].dir
    manifest = read_json(folder / "manifest.json")
    metrics = manifest["metrics"]
    assert metrics["teacher_accuracy"] >= 0.8
    assert metrics["accuracy"] >= metrics["teacher_accuracy"] - 0.1, metrics["eval_curve"]
    assert metrics["agreement"] >= 0.8
    assert metrics["parameters"] < metrics["source_parameters"]
    assert set(metrics["loss_curves"]) == {"soft", "hard", "hidden", "total"}
    assert len(metrics["loss_curves"]["total"]) == metrics["epochs_run"] == 4
    assert metrics["loss_curves"]["soft"][-1] < metrics["loss_curves"]["soft"][0]
    assert manifest["info"]["layer_map"] == [[0, 0], [1, 2]]
    student, _ = load_classifier(folder)
    assert student.config.num_hidden_layers == 1
    cached = list((result.run_dir / ".cache" / "distill").glob("teacher-*.safetensors"))
    assert len(cached) == 2  # train (with hidden states) and eval (logits only)


def test_attention_and_projected_mse_terms_train_a_narrower_student(tmp_path, teacher, caplog):
    caplog.set_level(logging.INFO, logger="compress")
    result = stage(
        tmp_path,
        teacher,
        weights="{soft: 1.0, hidden: 1.0, attention: 1.0}",
        metric="mse",
        epochs=2,
        extra="    hidden_size: 16\n",
    )
    curves = result.metrics["loss_curves"]
    assert result.metrics["parameters"] < result.metrics["source_parameters"] / 2
    assert set(curves) == {"soft", "hidden", "attention", "total"}
    assert curves["hidden"][-1] < curves["hidden"][0]
    epochs = [r.getMessage() for r in caplog.records if r.getMessage().startswith("distill epoch")]
    assert len(epochs) == 2
    # a person reads these: four decimals, not 0.7400000095367432
    assert all(
        re.fullmatch(r"distill epoch \d: loss \d+\.\d{4} eval (\w+ \d\.\d{4}(, )?)+", e) for e in epochs
    )


def test_the_attention_term_alone_trains_the_narrower_students_attention_maps(tmp_path, teacher):
    # beside the hidden term (MSE ~1.3 against ~0.008) its share of the gradient is too small to move its
    # own curve in two epochs of this tiny model, so it is checked on its own
    result = stage(
        tmp_path, teacher, weights="{attention: 1.0}", metric="mse", epochs=3, extra="    hidden_size: 16\n"
    )
    curve = result.metrics["loss_curves"]["attention"]
    assert curve[-1] < curve[1] < curve[0]


def test_layer_map_out_of_range_is_a_recipe_error(tmp_path, teacher):
    stages = (
        "  - type: distill\n    layers: 1\n    weights: {hidden: 1.0}\n    hidden: {layer_map: [[1, 5]]}\n"
    )
    recipe = load_recipe(
        write_recipe(tmp_path / "r.yaml", teacher=teacher[0], data=teacher[1], stages=stages)
    )
    with pytest.raises(RecipeError, match=r"stages\[0\]\.hidden\.layer_map: pair \[1, 5\] is out of range"):
        run_recipe(recipe, tmp_path / "runs")


def test_more_layers_than_the_teacher_is_a_recipe_error(tmp_path, teacher):
    stages = "  - type: distill\n    layers: 3\n"
    recipe = load_recipe(
        write_recipe(tmp_path / "r.yaml", teacher=teacher[0], data=teacher[1], stages=stages)
    )
    with pytest.raises(RecipeError, match=r"stages\[0\]\.layers: 3 is more than the teacher's 2 layers"):
        run_recipe(recipe, tmp_path / "runs")


def test_mlm_augmentation_and_unlabelled_text_feed_the_transfer_set(tmp_path, teacher):
    unlabelled = tmp_path / "more.tsv"
    unlabelled.write_text("sentence\nthe staff was so friendly\nthe screen is broken\n")
    extra = (
        "    mlm: {whole_word: true, dynamic: false}\n"
        "    augment: {multiplier: 2, candidates: 3}\n"
        f"    unlabelled: {{path: {unlabelled}, text: sentence}}\n"
    )
    result = stage(tmp_path, teacher, weights="{soft: 1.0, mlm: 0.5}", extra=extra, epochs=1)
    rows = len(teacher[1]["train"].read_text().splitlines()) - 1
    assert result.info["transfer_rows"] == 3 * (rows + 2)
    assert result.info["labelled_rows"] == rows
    assert set(result.metrics["loss_curves"]) == {"soft", "mlm", "total"}


def test_non_finite_loss_names_the_step_and_keeps_the_last_good_checkpoint(tmp_path, teacher, monkeypatch):
    import compress.distill.objective as objective

    calls = []
    real = objective.soft_kl

    def poisoned(*args):
        calls.append(1)
        value = real(*args)
        return value * float("nan") if len(calls) > 8 else value

    monkeypatch.setattr(objective, "soft_kl", poisoned)
    with pytest.raises(
        TrainingError, match=r"loss became nan at step 8; .*last good checkpoint: (\S+)"
    ) as err:
        run(tmp_path, teacher)
    folder = Path(err.value.args[0].rsplit("last good checkpoint: ", 1)[1])
    assert load_classifier(folder)[0].config.num_hidden_layers == 1


def test_int8_epochs_start_from_the_best_float_epoch_and_keep_their_own_best(tmp_path, teacher, caplog):
    caplog.set_level(logging.INFO, logger="compress")
    result = stage(tmp_path, teacher, epochs=2, extra="    quantization_aware: {epochs: 2, lr: 1.0e-3}\n")
    metrics = result.metrics
    phases = [h["phase"] for h in metrics["eval_curve"]]
    assert phases == ["joint", "joint", "int8", "int8"]
    assert metrics["int8_epochs"] == 2 and metrics["epochs_run"] == 4
    start = metrics["int8_start"]  # the best float epoch, scored as int8 computes it
    assert start["epoch"] in (1, 2)
    if metrics["int8_kept"]:  # chosen among the int8 epochs, on their int8 scores
        assert metrics["best_epoch"] in (3, 4)
        best = metrics["eval_curve"][metrics["best_epoch"] - 1]
        assert best["accuracy"] > start["accuracy"]
    else:
        assert metrics["best_epoch"] == start["epoch"]
        best = start
    assert metrics["agreement"] == best["agreement"] and metrics["kl"] == best["kl"] >= 0.0
    assert any("layers computing as dynamic int8" in r.getMessage() for r in caplog.records)
    student, _ = load_classifier(tmp_path / "work" / "out")  # the saved student is a plain float model
    assert not any("forward" in vars(m) for m in student.modules())


@pytest.mark.parametrize(("int8_scores", "kept_call"), [((0.6, 0.65), 1), ((0.6, 0.69), 4)])
def test_an_int8_epoch_is_kept_only_if_it_beats_the_best_float_epoch_scored_as_int8(
    tmp_path, teacher, monkeypatch, int8_scores, kept_call
):
    """Scripted eval scores: float epochs 0.5 and 0.7, the float best scored as int8 0.68, then the
    int8 epochs; the saved student holds the weights of the call that should win."""
    from compress.distill import trainer

    real = trainer.evaluate
    scripted = [0.5, 0.7, 0.68, *int8_scores]
    states = []

    def evaluate(student, data, batch_size):
        scores = real(student, data, batch_size)
        states.append({k: v.detach().clone() for k, v in student.state_dict().items()})
        return {**scores, "accuracy": scripted[len(states) - 1]}

    monkeypatch.setattr(trainer, "evaluate", evaluate)
    result = stage(tmp_path, teacher, epochs=2, extra="    quantization_aware: {epochs: 2, lr: 1.0e-3}\n")
    metrics = result.metrics
    assert len(states) == 5
    assert metrics["int8_start"]["epoch"] == 2 and metrics["int8_start"]["accuracy"] == 0.68
    assert metrics["int8_kept"] is (kept_call == 4)
    assert metrics["best_epoch"] == (2 if kept_call == 1 else 4)
    assert metrics["accuracy"] == scripted[kept_call if kept_call == 4 else 2]
    for name, value in states[2].items():  # the int8 epochs start from the best float epoch's weights
        assert torch.equal(value, states[1][name]), name
    student, _ = load_classifier(tmp_path / "work" / "out")
    saved = student.state_dict()
    expected = states[kept_call]
    assert all(torch.allclose(saved[name], expected[name]) for name in saved)
    other = states[4 if kept_call == 1 else 1]
    assert not all(torch.allclose(saved[name], other[name]) for name in saved)


def test_training_does_not_depend_on_whether_the_teacher_outputs_were_cached(tmp_path, teacher):
    """The second run finds the teacher's outputs in the shared cache instead of computing them; the
    student it trains is the first run's, weight for weight."""
    recipe = recipe_file(tmp_path, teacher, epochs=2)
    work = tmp_path / "work"
    first = handler_only(recipe, work, teacher[0])[0].metrics
    weights = load_classifier(work / "out")[0].state_dict()
    assert any((work / ".cache").iterdir())
    second = handler_only(recipe, work, teacher[0])[0].metrics
    assert second["eval_curve"] == first["eval_curve"]
    again = load_classifier(work / "out")[0].state_dict()
    assert all(torch.equal(again[name], weights[name]) for name in weights)
