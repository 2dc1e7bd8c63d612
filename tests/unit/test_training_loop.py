"""The one training loop (``compress.training.run_epoch``) and the keeper of the best epoch
(``BestKeeper``), on a tiny linear model; then that the finetune and distill stages both train
through that one function."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

import compress.distill.loop as loop
import compress.training as training
from compress.errors import TrainingError
from compress.stages import get_stage
from compress.training import BestKeeper, optimizer_and_schedule, run_epoch
from tests.helpers.stages import stage_context
from tests.helpers.tiny import write_recipe


def tiny_setup(rows: int = 12, batch_size: int = 4) -> tuple[torch.nn.Linear, torch.utils.data.DataLoader]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x = torch.randn(rows, 3)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    return model, torch.utils.data.DataLoader(data, batch_size=batch_size)


def saver(model: torch.nn.Module):
    def save(folder: Path) -> None:
        torch.save(model.state_dict(), folder / "weights.pt")

    return save


def epoch(model, loader, loss, check, lr: float = 0.1) -> dict[str, float]:
    optimizer, schedule = optimizer_and_schedule(
        model, lr=lr, weight_decay=0.0, warmup_ratio=0.0, total_steps=10 * len(loader)
    )
    return run_epoch(
        model,
        loader,
        Accelerator(cpu=True),
        optimizer,
        schedule,
        loss=loss,
        check=check,
        max_grad_norm=1.0,
        label="test epoch",
    )


def test_an_epoch_returns_each_terms_mean_and_takes_one_step_per_batch():
    model, loader = tiny_setup()
    seen: list[dict[str, float]] = []
    snapshots: list[torch.Tensor] = []

    def loss(batch):
        x, y = batch
        snapshots.append(model.weight.detach().clone())
        mse = torch.nn.functional.mse_loss(model(x), y)
        size = model.weight.abs().sum()
        seen.append({"mse": mse.item(), "size": size.item()})
        return {"total": mse + 0.1 * size, "mse": mse, "size": size}

    checked: list[float] = []
    means = epoch(model, loader, loss, lambda total: checked.append(total.item()))
    assert set(means) == {"total", "mse", "size"}
    for name in ("mse", "size"):
        assert means[name] == pytest.approx(sum(s[name] for s in seen) / len(seen), rel=1e-6)
    expected_total = sum(s["mse"] + 0.1 * s["size"] for s in seen) / len(seen)
    assert means["total"] == pytest.approx(expected_total, rel=1e-6)
    assert checked == pytest.approx([s["mse"] + 0.1 * s["size"] for s in seen], rel=1e-6)
    assert len(seen) == len(loader) == 3
    # every batch saw the weights the previous batch's step left, and the gradients were cleared
    assert all(not torch.equal(a, b) for a, b in itertools.pairwise(snapshots))
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    assert model.training


def test_a_non_finite_loss_stops_before_the_update_and_names_the_last_good_checkpoint(tmp_path):
    model, loader = tiny_setup()
    folder = tmp_path / "best"
    keeper = BestKeeper(model, folder, saver(model), writer=True, stage="finetune")
    calls = {"n": 0}
    before: dict[str, torch.Tensor] = {}

    def loss(batch):
        x, y = batch
        calls["n"] += 1
        value = torch.nn.functional.mse_loss(model(x), y)
        if calls["n"] == 5:  # the second batch of the second epoch
            before.update({k: v.detach().clone() for k, v in model.state_dict().items()})
            return {"total": value * math.nan}
        return {"total": value}

    epoch(model, loader, loss, keeper.check)
    assert keeper.offer(0.5) and (folder / "weights.pt").is_file()
    with pytest.raises(TrainingError) as info:
        epoch(model, loader, loss, keeper.check)
    message = str(info.value)
    assert message.startswith("finetune: loss became nan at step 4; lower the learning rate")
    assert message.endswith(f"; last good checkpoint: {folder}")
    for name, value in model.state_dict().items():  # the NaN batch never reached the weights
        assert torch.equal(value, before[name])


def test_a_non_finite_first_loss_says_no_checkpoint_was_saved(tmp_path):
    model, loader = tiny_setup()
    keeper = BestKeeper(model, tmp_path / "best", saver(model), writer=True, stage="distill")
    with pytest.raises(
        TrainingError, match=r"^distill: loss became inf at step 0; .*; no checkpoint was saved yet$"
    ):
        epoch(model, loader, lambda batch: {"total": torch.tensor(math.inf)}, keeper.check)
    assert not (tmp_path / "best").exists()


def test_the_keeper_keeps_the_best_epoch_and_counts_the_epochs_since(tmp_path):
    model = torch.nn.Linear(2, 1)
    folder = tmp_path / "best"
    keeper = BestKeeper(model, folder, saver(model), writer=True, stage="distill")
    taken, waited = [], []
    for i, score in enumerate([0.5, 0.4, 0.5, 0.7, 0.6]):
        with torch.no_grad():
            model.weight.fill_(float(i))
        taken.append(keeper.offer(score))
        waited.append(keeper.waited)
    assert taken == [True, False, False, True, False]  # a tie is not an improvement
    assert waited == [0, 1, 2, 0, 1]
    assert keeper.score == 0.7 and torch.equal(keeper.state["weight"], torch.full((1, 2), 3.0))
    assert torch.equal(torch.load(folder / "weights.pt")["weight"], torch.full((1, 2), 3.0))
    keeper.restart()  # later scores are compared among themselves only; the checkpoint still counts
    assert keeper.offer(0.1) and keeper.waited == 0 and keeper.saved


def test_only_the_writer_saves_and_in_memory_can_be_off(tmp_path):
    model = torch.nn.Linear(2, 1)
    other_rank = BestKeeper(model, tmp_path / "a", saver(model), writer=False, stage="distill")
    assert other_rank.offer(0.5) and other_rank.state is not None and not (tmp_path / "a").exists()
    with pytest.raises(TrainingError, match=f"last good checkpoint: {tmp_path / 'a'}$"):
        other_rank.check(torch.tensor(math.nan))  # rank 0 wrote it: the message is the same on every rank
    on_disk_only = BestKeeper(
        model, tmp_path / "b", saver(model), writer=True, stage="finetune", in_memory=False
    )
    assert (
        on_disk_only.offer(0.5) and on_disk_only.state is None and (tmp_path / "b" / "weights.pt").is_file()
    )


def test_finetune_and_distill_both_train_through_run_epoch(tmp_path, tiny_bert_dir, reviews, monkeypatch):
    assert loop.run_epoch is training.run_epoch  # distill's loop holds the shared function itself
    labels: list[str] = []
    returned: list[dict[str, float]] = []
    real = training.run_epoch

    def spy(*args, **kwargs):
        labels.append(kwargs["label"])
        returned.append(real(*args, **kwargs))
        return returned[-1]

    monkeypatch.setattr(training, "run_epoch", spy)  # finetune imports it when it runs
    monkeypatch.setattr(loop, "run_epoch", spy)
    stages = {
        "finetune": "  - type: finetune\n    when: always\n    epochs: 2\n    batch_size: 32\n",
        "distill": "  - type: distill\n    layers: 1\n    epochs: 1\n    batch_size: 32\n",
    }
    results = {}
    for name, text in stages.items():
        recipe = write_recipe(tmp_path / f"{name}.yaml", teacher=tiny_bert_dir, data=reviews, stages=text)
        ctx = stage_context(recipe, tmp_path / name, tiny_bert_dir)
        results[name] = get_stage(name).run(ctx)
    assert labels == ["finetune epoch 1/2", "finetune epoch 2/2", "distill 1/1"]
    history = results["finetune"].metrics["history"]
    assert [h["train_loss"] for h in history] == [r["total"] for r in returned[:2]]
    assert results["distill"].metrics["loss_curves"]["total"] == [round(returned[2]["total"], 6)]


@pytest.mark.slow
def test_finetune_runs_data_parallel_and_a_nan_on_one_rank_stops_both(tmp_path, tiny_bert_dir, reviews):
    """Both ranks report the same (reduced) losses and best epoch; a NaN on rank 1 alone stops rank 0
    at the same step too, instead of leaving it waiting for rank 1's gradients."""
    import json
    import os
    import subprocess
    import sys

    stages = "  - type: finetune\n    when: always\n    epochs: 2\n    batch_size: 16\n    lr: 1.0e-3\n"
    recipe = write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=stages)
    repo = Path(__file__).resolve().parents[2]
    worker = repo / "tests" / "integration" / "finetune_ddp_worker.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone"]
    (tmp_path / "work").mkdir()
    proc = subprocess.run(
        [*command, str(worker), str(recipe), str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / "work" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["clean"] == ranks[1]["clean"] and len(ranks[0]["clean"]["history"]) == 2
    assert 0.0 <= ranks[0]["clean"]["eval_accuracy"] <= 1.0
    assert ranks[0]["error"] == ranks[1]["error"]
    assert ranks[0]["error"].startswith("finetune: loss became nan at step 4; lower the learning rate")
    kept = Path(ranks[0]["error"].rsplit("last good checkpoint: ", 1)[1])
    assert (kept / "model.safetensors").is_file()


def test_classification_metrics_kl_is_the_divergence_from_the_reference():
    reference = torch.tensor([[2.0, -1.0], [0.0, 1.0], [3.0, 3.0]])
    same = training.classification_metrics(reference, [0, 1, 0], reference=reference)
    assert same == {"accuracy": 1.0, "agreement": 1.0, "kl": pytest.approx(0.0, abs=1e-7)}
    # same argmax on every row, so agreement cannot tell the two apart; the divergence can
    closer = reference * 0.9
    further = reference * 0.3
    near = training.classification_metrics(closer, None, reference=reference)
    far = training.classification_metrics(further, None, reference=reference)
    assert near["agreement"] == far["agreement"] == 1.0 and "accuracy" not in near
    assert 0.0 < near["kl"] < far["kl"]
    p = torch.softmax(reference, -1)
    q = torch.softmax(further, -1)
    assert far["kl"] == pytest.approx(float((p * (p.log() - q.log())).sum(-1).mean()), rel=1e-5)
    assert "kl" not in training.classification_metrics(reference, [0, 1, 0])


def test_the_schedule_warms_up_linearly_then_decays_to_zero_and_the_optimiser_is_fused():
    model = torch.nn.Linear(3, 1)
    optimizer, schedule = optimizer_and_schedule(
        model, lr=1.0, weight_decay=0.1, warmup_ratio=0.2, total_steps=10
    )
    assert optimizer.defaults["fused"] is True
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]  # the bias is not decayed
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates == pytest.approx([0.0, 0.5, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125])
    assert optimizer.param_groups[0]["lr"] == 0.0
