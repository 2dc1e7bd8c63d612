"""One rank of the 2-process finetune test (run by torchrun): the recipe's finetune stage alone,
once as written and once with rank 1's training loss turning NaN after ``POISON_AFTER`` steps;
records each run's metrics or error in ``rank-<r>.json``."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from transformers import BertForSequenceClassification

from compress.api import run_stage
from compress.errors import TrainingError
from compress.recipe import load_recipe

POISON_AFTER = 4
"""96 rows, batches of 16 over 2 ranks: 3 steps an epoch, so the NaN comes in the second epoch."""


def poison_after(steps: int) -> None:
    original = BertForSequenceClassification.forward
    seen = {"steps": 0}

    def forward(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if self.training:
            seen["steps"] += 1
            if seen["steps"] > steps:
                out.loss = out.loss * math.nan
        return out

    BertForSequenceClassification.forward = forward


def main(recipe_path: str, work: str) -> None:
    recipe, work_dir, rank = load_recipe(recipe_path), Path(work), int(os.environ["RANK"])
    clean = run_stage(recipe, work_dir / f"clean-{rank}").metrics
    if rank == 1:
        poison_after(POISON_AFTER)
    try:
        run_stage(recipe, work_dir / f"poisoned-{rank}")
        error = None
    except TrainingError as exc:
        error = str(exc)
    record = {key: clean[key] for key in ("eval_accuracy", "best_epoch", "history")}
    (work_dir / f"rank-{rank}.json").write_text(json.dumps({"clean": record, "error": error}))


if __name__ == "__main__":
    main(*sys.argv[1:])
