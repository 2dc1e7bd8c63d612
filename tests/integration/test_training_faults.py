"""Training faults: a non-finite loss stops the stage at once, names the step and keeps the last good
checkpoint; an eval split with a single class still gives sensible numbers.

The NaN is injected by wrapping the tiny BERT's forward (so it hits exactly one chosen training
step), or through the CLI with a learning rate of 1e30 that blows the weights up after one update.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compress.errors import TrainingError
from compress.io import read_json
from compress.pipeline import run_recipe
from compress.recipe import load_recipe
from tests.helpers.tiny import write_recipe

COPY = "  - type: finetune\n    epochs: 1\n"
FINETUNE = "  - type: finetune\n    when: always\n    epochs: 3\n    batch_size: 16\n    lr: 3.0e-3\n"
DISTILL = "  - type: distill\n    layers: 1\n    epochs: 3\n    batch_size: 32\n    patience: null\n"


def poison_training_step(monkeypatch: pytest.MonkeyPatch, good_steps: int) -> None:
    """Every training forward after the first ``good_steps`` returns NaN logits and loss."""
    from transformers import BertForSequenceClassification

    original = BertForSequenceClassification.forward
    seen = {"steps": 0}

    def forward(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if self.training:
            seen["steps"] += 1
            if seen["steps"] > good_steps:
                out.logits = out.logits * math.nan
                if out.loss is not None:
                    out.loss = out.loss * math.nan
        return out

    monkeypatch.setattr(BertForSequenceClassification, "forward", forward)


def leftovers(run_dir: Path) -> list[str]:
    """Temporary names, and stage folders without a complete manifest."""
    bad = [p.name for p in run_dir.glob(".*tmp*")]
    for folder in run_dir.glob("[0-9][0-9]-*"):
        manifest = folder / "manifest.json"
        if not manifest.is_file() or read_json(manifest).get("complete") is not True:
            bad.append(folder.name)
    return bad


def test_nan_in_distill_names_the_step_and_keeps_the_best_checkpoint(
    tmp_path, tiny_bert_dir, reviews, monkeypatch
):
    path = write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=COPY + DISTILL)
    poison_training_step(monkeypatch, good_steps=4)  # 96 rows / 32 = 3 steps per epoch: NaN in epoch 2
    with pytest.raises(TrainingError) as info:
        run_recipe(load_recipe(path), tmp_path / "runs")
    message = str(info.value)
    assert "\n" not in message and "step 4" in message and "learning rate" in message
    kept = Path(message.rsplit("last good checkpoint: ", 1)[1].split(";")[0].strip())
    assert (kept / "model.safetensors").is_file() and (kept / "config.json").is_file()
    from compress.models import load_classifier

    model, _ = load_classifier(kept)
    assert all(bool(p.isfinite().all()) for p in model.parameters())
    run_dir = tmp_path / "runs" / "tiny"
    assert read_json(run_dir / "01-finetune" / "manifest.json")["complete"] is True
    assert not (run_dir / "02-distill").exists() and leftovers(run_dir) == []


def test_nan_in_finetune_names_the_step_and_keeps_the_best_checkpoint(
    tmp_path, tiny_bert_dir, reviews, monkeypatch
):
    path = write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=COPY + FINETUNE)
    poison_training_step(monkeypatch, good_steps=8)  # 96 rows / 16 = 6 steps per epoch: NaN in epoch 2
    with pytest.raises(TrainingError) as info:
        run_recipe(load_recipe(path), tmp_path / "runs")
    message = str(info.value)
    assert "\n" not in message and "step 8" in message
    run_dir = tmp_path / "runs" / "tiny"
    assert read_json(run_dir / "01-finetune" / "manifest.json")["complete"] is True
    assert not (run_dir / "02-finetune").exists() and leftovers(run_dir) == []
    assert "last good checkpoint: " in message
    kept = Path(message.rsplit("last good checkpoint: ", 1)[1].split(";")[0].strip())
    assert (kept / "model.safetensors").is_file()


def test_huge_learning_rate_through_the_cli_is_one_line(tmp_path, tiny_bert_dir, reviews):
    stages = "  - type: distill\n    layers: 1\n    epochs: 1\n    batch_size: 16\n    lr: 1.0e+30\n"
    path = write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=stages)
    done = subprocess.run(
        [sys.executable, "-m", "compress.cli", "run", str(path), "--out", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert "distill: loss became" in errors[0] and "at step " in errors[0] and "learning rate" in errors[0]
    assert leftovers(tmp_path / "runs" / "tiny") == []


def single_class(reviews: dict[str, Path]) -> dict[str, Path]:
    """Keep only the 'positive' rows of the eval and test splits."""
    for split in ("dev", "test"):
        rows = reviews[split].read_text().splitlines()
        reviews[split].write_text("\n".join([rows[0], *(r for r in rows[1:] if r.endswith("\t1"))]) + "\n")
    return reviews


def test_single_class_eval_split_gives_sensible_metrics(tmp_path, tiny_bert_dir, reviews):
    stages = FINETUNE.replace("epochs: 3", "epochs: 1") + DISTILL.replace("epochs: 3", "epochs: 1")
    path = write_recipe(
        tmp_path / "r.yaml",
        teacher=tiny_bert_dir,
        data=single_class(reviews),
        stages=stages,
        extra="evaluate: {latency_samples: 3, warmup: 0}\n",
    )
    result = run_recipe(load_recipe(path), tmp_path / "runs")
    finetune, distill = (read_json(stage.dir / "manifest.json")["metrics"] for stage in result.stages)
    assert 0.0 <= finetune["eval_accuracy"] <= 1.0
    assert 0.0 <= distill["accuracy"] <= 1.0 and 0.0 <= distill["agreement"] <= 1.0
    entries = [result.report["teacher"], *result.report["checkpoints"]]
    assert len(entries) >= 2
    for entry in entries:
        metrics = entry["metrics"]
        assert metrics["per_class"]["negative"]["support"] == 0
        assert metrics["per_class"]["positive"]["support"] == 16
        for key in ("accuracy", "macro_f1"):
            assert 0.0 <= metrics[key] <= 1.0, (entry["name"], key, metrics[key])


def test_macro_f1_ignores_a_class_absent_from_gold_and_predictions():
    """All eval rows are 'positive' and the model predicts all of them right: that is a perfect score."""
    import numpy as np

    from compress.metrics import task_metrics

    logits = np.array([[0.0, 1.0]] * 5)
    metrics = task_metrics(logits, [1] * 5, ["negative", "positive"])
    assert metrics["accuracy"] == 1.0
    assert metrics["per_class"]["negative"] == {"support": 0, "predicted": 0, "correct": 0}
    assert metrics["macro_f1"] == pytest.approx(1.0)
