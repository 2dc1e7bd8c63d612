"""MiniLM's self-attention relation transfer and TinyBERT's two-step order, on tiny models."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from compress.distill.config import DistillOptions
from compress.distill.losses import relation_kl
from compress.distill.objective import (
    DistillModule,
    RelationLayers,
    frozen_projections,
    qkv_projections,
    relation_layers,
)
from compress.errors import RecipeError
from compress.models import load_classifier
from compress.recipe import load_recipe
from compress.stages import get_stage
from tests.helpers.stages import stage_context
from tests.helpers.tiny import make_tiny_bert, write_recipe

KINDS = ("query", "key", "value")


def qkv(seed: int, shape=(2, 5, 8)) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {k: torch.randn(*shape, generator=generator) for k in KINDS}


MASK = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])


def test_relation_kl_matches_a_hand_value():
    # one head, d = 1: the teacher's relations are uniform; the student's first row is softmax([1, 0])
    student = {"query": torch.tensor([[[1.0], [0.0]]])}
    teacher = {"query": torch.zeros(1, 2, 1)}
    p = math.e / (1 + math.e)
    first_row = 0.5 * math.log(0.5 / p) + 0.5 * math.log(0.5 / (1 - p))
    loss = relation_kl(student, teacher, torch.ones(1, 2), heads=1)
    assert loss.item() == pytest.approx(first_row / 2, rel=1e-5)  # the second row's KL is 0


def test_relation_kl_is_zero_for_equal_inputs_and_positive_otherwise():
    same = qkv(0)
    assert relation_kl(same, same, MASK, heads=2).item() == pytest.approx(0.0, abs=1e-6)
    assert relation_kl(qkv(1), same, MASK, heads=2).item() > 0.05


def test_relation_kl_ignores_padding():
    student, teacher = qkv(1), qkv(2)
    loss = relation_kl(student, teacher, MASK, heads=2)
    for values in (student, teacher):
        for tensor in values.values():
            tensor[0, 3:] = 1e4 * torch.randn(2, 8)
    assert relation_kl(student, teacher, MASK, heads=2).item() == pytest.approx(loss.item(), rel=1e-6)
    # a padded row counts as its real tokens alone
    alone = relation_kl(
        {k: v[:1, :3] for k, v in student.items()},
        {k: v[:1, :3] for k, v in teacher.items()},
        torch.ones(1, 3),
        heads=2,
    )
    padded = relation_kl(
        {k: v[:1] for k, v in student.items()}, {k: v[:1] for k, v in teacher.items()}, MASK[:1], heads=2
    )
    assert padded.item() == pytest.approx(alone.item(), rel=1e-5)


def test_relation_kl_compares_models_of_different_widths_and_is_finite_on_empty_rows():
    student = {k: v.requires_grad_() for k, v in qkv(3, (2, 5, 4)).items()}
    mask = MASK.clone()
    mask[0] = 0  # a row with no real token at all (cannot happen in a batch, must not poison one)
    loss = relation_kl(student, qkv(4, (2, 5, 8)), mask, heads=2)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(v.grad).all() for v in student.values())
    assert (student["query"].grad[0] == 0).all() and (student["query"].grad[1] != 0).any()


@pytest.fixture(scope="module")
def sharp_teacher(tmp_path_factory):
    """A tiny BERT whose q/k/v weights are scaled up, so its relations are far from uniform."""
    folder = make_tiny_bert(tmp_path_factory.mktemp("sharp"), layers=2, hidden=32, seed=0)
    model, _ = load_classifier(folder)
    with torch.no_grad():
        for layer in model.bert.encoder.layer:
            for name in KINDS:
                getattr(layer.attention.self, name).weight.mul_(20)
    model.save_pretrained(str(folder))
    return folder


def batch_of(tokenizer, texts=("the film was really good", "bad")) -> dict[str, torch.Tensor]:
    enc = tokenizer(list(texts), padding=True, return_tensors="pt")
    return {**enc, "labels": torch.tensor([1, 0]), "index": torch.arange(len(texts))}


def module_for(student, teacher, student_layer: int, teacher_layer: int, heads: int = 2) -> DistillModule:
    options = DistillOptions(weights={"soft": 0, "relation": 1})
    layers = RelationLayers(student_layer, teacher_layer, heads, KINDS)
    return DistillModule(
        student, options, [(1, 1)], teacher.config.hidden_size, (layers, frozen_projections(teacher, layers))
    )


def teacher_target(teacher, batch) -> dict:
    with torch.no_grad():
        out = teacher(
            **{k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")},
            output_hidden_states=True,
        )
    return {"logits": out.logits, "hidden": dict(enumerate(out.hidden_states)), "attentions": {}}


def test_relation_term_is_zero_for_the_teacher_itself_and_trains_the_students_projections(
    tmp_path, sharp_teacher
):
    teacher, tokenizer = load_classifier(sharp_teacher)
    teacher.eval()
    batch = batch_of(tokenizer)
    target = teacher_target(teacher, batch)
    module = module_for(copy.deepcopy(teacher), teacher, 2, 2).eval()
    terms = module(batch, target, None)
    assert set(terms) == {"relation", "total"}
    assert terms["relation"].item() == pytest.approx(0.0, abs=1e-6)

    other, _ = load_classifier(make_tiny_bert(tmp_path / "other", seed=5))
    module = module_for(other, teacher, 2, 2)
    loss = module(batch, target, None)["total"]
    assert loss.item() > 1e-3
    loss.backward()
    for name in KINDS:
        grad = getattr(other.bert.encoder.layer[1].attention.self, name).weight.grad
        assert grad is not None and grad.abs().sum() > 0
    assert all(not p.requires_grad for p in module.teacher_projections.parameters())
    assert other.classifier.weight.grad is None


def test_projections_applied_to_the_layer_input_are_what_the_layer_computes_even_when_tied(tiny_bert_dir):
    from compress.share.tying import make_plan, tie_layers

    model, tokenizer = load_classifier(tiny_bert_dir)
    tie_layers(model, make_plan("all", 2, relax_rank=4), init="mean")
    with torch.no_grad():  # the corrections start at zero; make each layer's differ
        for layer in model.bert.encoder.layer:
            layer.attention.self.query.lora_b.normal_()
    model.eval()
    seen = []
    handles = [
        layer.attention.self.query.register_forward_hook(lambda m, a, out: seen.append(out))
        for layer in model.bert.encoder.layer
    ]
    batch = batch_of(tokenizer)
    with torch.no_grad():
        states = model(
            **{k: batch[k] for k in ("input_ids", "attention_mask")}, output_hidden_states=True
        ).hidden_states
        for handle in handles:
            handle.remove()
        for layer in (1, 2):
            mine = qkv_projections(model, layer)["query"](states[layer - 1])
            assert torch.allclose(mine, seen[layer - 1], atol=1e-6)
    assert not torch.allclose(seen[0], seen[1])


def test_distilbert_projections_are_found():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    model = DistilBertForSequenceClassification(
        DistilBertConfig(
            vocab_size=50, dim=16, n_layers=2, n_heads=2, hidden_dim=32, max_position_embeddings=32
        )
    )
    found = qkv_projections(model, 2)
    assert found["key"] is model.distilbert.transformer.layer[1].attention.k_lin


def test_relation_options_are_checked_against_both_models(tmp_path, tiny_bert_dir):
    teacher, _ = load_classifier(tiny_bert_dir)
    narrow, _ = load_classifier(make_tiny_bert(tmp_path / "narrow", layers=1, hidden=12))
    resolved = relation_layers(DistillOptions(weights={"relation": 1}), narrow, teacher)
    assert (resolved.student, resolved.teacher, resolved.heads) == (1, 2, 2)
    chosen = DistillOptions(relation={"teacher_layer": 1, "student_layer": -1, "relation_heads": 4})
    assert (
        relation_layers(chosen, narrow, teacher).heads == 4
        and relation_layers(chosen, narrow, teacher).teacher == 1
    )
    with pytest.raises(
        RecipeError, match=r"^relation\.relation_heads: 5 does not divide the student's query width 12"
    ):
        relation_layers(DistillOptions(relation={"relation_heads": 5}), narrow, teacher)
    with pytest.raises(
        RecipeError, match=r"^relation\.teacher_layer: 3 is out of range; the teacher has layers 1\.\.2"
    ):
        relation_layers(DistillOptions(relation={"teacher_layer": 3}), narrow, teacher)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"relation": {"teacher_layer": 0}}, "teacher_layer: 0 is not a layer; layers count from 1"),
        ({"relation": {"student_layer": -2}}, "student_layer: -2 is not a layer"),
        ({"relation": {"relations": ["query", "query"]}}, "lists a relation twice"),
        ({"relation": {"relations": []}}, "at least 1"),
        ({"relation": {"relation_heads": 0}}, "greater than 0"),
        (
            {"epochs": 2, "intermediate_epochs": 2, "weights": {"relation": 1}},
            "leaves no epoch for the prediction",
        ),
        ({"epochs": 3, "intermediate_epochs": 1}, r"give weights\.relation \(or hidden, attention\) > 0"),
        (
            {"epochs": 3, "intermediate_epochs": 1, "weights": {"soft": 0, "relation": 1}},
            r"give weights\.soft \(or hard, mlm, rtd\) > 0",
        ),
    ],
)
def test_bad_options_are_refused_at_the_door(options, message):
    with pytest.raises(ValidationError, match=message):
        DistillOptions.model_validate(options)


def test_a_recipe_error_is_one_line_naming_the_key(tmp_path, tiny_bert_dir, reviews):
    cases = {
        "    epochs: 2\n    intermediate_epochs: 2\n    weights: {soft: 1, relation: 1}\n": (
            r"stages\[0\]\.intermediate_epochs: 2 leaves no epoch for the prediction terms; set it below"
        ),
        "    intermediate_epochs: 1\n": r"stages\[0\]\.intermediate_epochs: 1 epochs would train only hidden",
        "    relation: {teacher_layer: 0}\n": r"stages\[0\]\.relation\.teacher_layer: 0 is not a layer",
    }
    for extra, message in cases.items():
        path = write_recipe(
            tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=f"  - type: distill\n{extra}"
        )
        with pytest.raises(RecipeError, match=message) as err:
            load_recipe(path)
        assert "\n" not in str(err.value)


context = stage_context


TWO_STEPS = """  - type: distill
    layers: 1
    epochs: 3
    intermediate_epochs: 1
    batch_size: 16
    lr: 3.0e-3
    patience: 1
    weights: {soft: 1.0, relation: 1.0}
"""


def test_two_steps_train_the_head_only_after_the_intermediate_epochs_and_select_among_later_ones(
    tmp_path, tiny_bert_dir, reviews, monkeypatch
):
    import compress.distill.loop as loop
    import compress.distill.objective as objective
    import compress.distill.trainer as trainer
    from compress.distill.student import build_student

    ctx = context(
        write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=TWO_STEPS),
        tmp_path / "work",
        tiny_bert_dir,
    )
    teacher, tokenizer = load_classifier(tiny_bert_dir)
    student, _ = build_student(teacher, 1, "every-other")
    head = {k: v.clone() for k, v in student.classifier.state_dict().items()}
    soft_calls, snapshots, schedules = [], [], []
    # the intermediate epoch scores best on purpose: it must neither be kept nor count toward patience
    scores = iter([0.9, 0.5, 0.6])

    def soft(*args):
        soft_calls.append(len(snapshots))
        return real_soft(*args)

    def evaluate(model, data, batch_size):
        snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        value = next(scores)
        return {"accuracy": value, "agreement": value, "kl": 1.0 - value}  # the shape loop.evaluate returns

    def schedule(module, **kw):
        schedules.append(kw["total_steps"])
        return real_schedule(module, **kw)

    real_soft, real_schedule = objective.soft_kl, loop.optimizer_and_schedule
    monkeypatch.setattr(objective, "soft_kl", soft)
    monkeypatch.setattr(trainer, "evaluate", evaluate)
    monkeypatch.setattr(loop, "optimizer_and_schedule", schedule)
    outcome = trainer.distill_model(student, tokenizer, tiny_bert_dir, ctx, ctx.config)

    steps = math.ceil(96 / 16)
    assert schedules == [steps, 2 * steps]  # one warm-up/decay schedule per step of the two
    assert soft_calls and min(soft_calls) == 1  # no soft term before the first evaluation
    after_intermediate = snapshots[0]
    for name, value in head.items():
        assert torch.equal(after_intermediate[f"classifier.{name}"], value)
    assert not torch.equal(snapshots[1]["classifier.weight"], head["weight"])
    assert not torch.equal(
        after_intermediate["bert.encoder.layer.0.attention.self.query.weight"],
        teacher.bert.encoder.layer[0].attention.self.query.weight,
    )
    metrics = outcome.metrics
    assert metrics["epochs_run"] == 3 and metrics["best_epoch"] == 3 and metrics["accuracy"] == 0.6
    assert [h["phase"] for h in metrics["eval_curve"]] == ["intermediate", "prediction", "prediction"]
    assert len(metrics["loss_curves"]["relation"]) == 1 and len(metrics["loss_curves"]["soft"]) == 2
    assert metrics["intermediate_epochs"] == 1
    for name, value in student.state_dict().items():
        assert torch.equal(value, snapshots[2][name])


def test_distill_stage_runs_with_the_relation_term_and_with_two_steps(tmp_path, tiny_bert_dir, reviews):
    base = "  - type: distill\n    layers: 1\n    batch_size: 16\n    lr: 3.0e-3\n    patience: null\n"
    runs = {
        "relation": "    epochs: 1\n    hidden_size: 16\n    weights: {soft: 1, relation: 1}\n",
        "two-steps": (
            "    epochs: 2\n    intermediate_epochs: 1\n    weights: {soft: 1, relation: 1, attention: 1}\n"
        ),
    }
    results = {}
    for name, extra in runs.items():
        recipe = write_recipe(
            tmp_path / f"{name}.yaml", teacher=tiny_bert_dir, data=reviews, stages=base + extra
        )
        ctx = context(recipe, tmp_path / name, tiny_bert_dir)
        results[name] = get_stage("distill").run(ctx)
        assert (ctx.out_dir / "model.safetensors").is_file()
    one = results["relation"]
    assert set(one.metrics["loss_curves"]) == {"soft", "relation", "total"}
    assert one.info["relation"] == {
        "student_layer": 1,
        "teacher_layer": 2,
        "relation_heads": 2,
        "relations": ["query", "key", "value"],
    }
    assert one.info["cached_teacher_layers"]["hidden"] == [1]  # the input of teacher layer 2
    two = results["two-steps"].metrics
    curves = two["loss_curves"]
    assert [len(curves[k]) for k in ("attention", "relation", "soft", "total")] == [1, 1, 1, 2]
    assert curves["total"][0] == pytest.approx(curves["attention"][0] + curves["relation"][0], abs=2e-6)
    assert curves["total"][1] == pytest.approx(curves["soft"][0], abs=1e-6)
    assert two["best_epoch"] == 2 and len(two["eval_curve"]) == 2


def test_share_recovery_trains_tied_layers_with_the_relation_term(tmp_path, tiny_bert_dir, reviews):
    from compress.share.model import load_shared_classifier
    from compress.share.tying import encoder_layers

    stages = (
        "  - type: share\n    layers: {mode: all, relax_rank: 4}\n"
        "    recovery: {epochs: 2, intermediate_epochs: 1, batch_size: 16, lr: 3.0e-3, "
        "weights: {soft: 1, relation: 1}}\n"
    )
    ctx = context(
        write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=stages),
        tmp_path / "work",
        tiny_bert_dir,
    )
    result = get_stage("share").run(ctx)
    recovery = result.metrics["recovery"]
    assert recovery["epochs_run"] == 2 and set(recovery["loss_curves"]) == {"soft", "relation", "total"}
    model, _ = load_shared_classifier(ctx.out_dir)
    first, second = (layer.attention.self.query for layer in encoder_layers(model))
    assert first.base is second.base and not torch.equal(first.lora_a, second.lora_a)


@pytest.mark.slow
def test_two_steps_run_data_parallel(tmp_path, tiny_bert_dir, reviews):
    """Each step leaves parameters without a gradient (the head, then W_h); DDP must be told so."""
    import os
    import subprocess
    import sys

    stages = TWO_STEPS.replace(
        "weights: {soft: 1.0, relation: 1.0}", "weights: {soft: 1, relation: 1, hidden: 1}"
    )
    recipe = write_recipe(
        tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=stages + "    hidden_size: 16\n"
    )
    repo = Path(__file__).resolve().parents[2]
    worker = repo / "tests" / "integration" / "distill_ddp_worker.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone"]
    proc = subprocess.run(
        [*command, str(worker), str(recipe), str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [(tmp_path / "work" / f"rank-{r}.txt").read_text().split() for r in (0, 1)]
    assert ranks[0] == ranks[1] and ranks[0][1] == "2"
