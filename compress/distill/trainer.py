"""The distillation loop on Hugging Face Accelerate: one process by default, data-parallel under
``accelerate launch`` / ``torchrun`` with no code change. Every rank computes the same decisions
(eval on the full eval set, losses reduced across ranks); only the main process writes files.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from compress.distill.config import DistillOptions
from compress.distill.data import prepare_transfer
from compress.distill.loop import Loop, evaluate, mlm_batch, rtd_batch, train_loader
from compress.distill.losses import Masker
from compress.distill.objective import DistillModule, phases
from compress.distill.qat import fake_int8
from compress.distill.rtd import Replacer, word_embeddings
from compress.models import save_checkpoint
from compress.stage_context import StageContext
from compress.training import BestKeeper, set_seed

log = logging.getLogger(__name__)


def selectable(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The epochs that can be kept: not the intermediate step's, whose classifier head has not been
    trained yet."""
    return [h for h in history if h.get("phase") != "intermediate"]


@dataclass
class DistillOutcome:
    metrics: dict[str, Any]
    info: dict[str, Any]
    is_main_process: bool


def distill_model(
    student: Any,
    tokenizer: Any,
    teacher_dir: Path,
    ctx: StageContext,
    options: DistillOptions,
    *,
    checkpoint_dir: Path | None = None,
) -> DistillOutcome:
    """Train ``student`` in place against the teacher; the best eval epoch's weights are restored
    (the best of the prediction step when ``intermediate_epochs`` > 0)."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    # Data-parallel training must be told when a step leaves parameters without a gradient: the
    # classifier head while only inner-layer terms train, TinyBERT's W_h while only predictions do.
    unused = options.intermediate_epochs > 0 or not (options.weights.soft > 0 or options.weights.hard > 0)
    handlers = [DistributedDataParallelKwargs(find_unused_parameters=True)] if unused else []
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), kwargs_handlers=handlers)
    set_seed(ctx.seed)
    start = time.time()
    checkpoint_dir = checkpoint_dir or ctx.cache_dir / "distill" / f"best-{ctx.index:02d}"
    data = prepare_transfer(student, tokenizer, teacher_dir, ctx, options, accelerator)
    # again: whether the teacher's outputs and the transfer set came from the cache or were computed
    # decides how many random numbers were drawn above, and training must not depend on it
    set_seed(ctx.seed)
    pairs = data.pairs
    implementation = student.config._attn_implementation
    module = DistillModule(student, options, pairs, data.teacher_width, data.relation)
    masker = (
        Masker(tokenizer, options.mlm, ctx.seed + accelerator.process_index)
        if options.weights.mlm > 0
        else None
    )
    static = (
        Masker(tokenizer, options.mlm, ctx.seed)(data.train_enc.input_ids, data.offsets)
        if (masker is not None and not options.mlm.dynamic)
        else None
    )
    replacer = (
        Replacer(
            tokenizer,
            word_embeddings(student),
            options.rtd,
            ctx.seed + accelerator.process_index,
            data.train_enc.input_ids,
        )
        if options.weights.rtd > 0
        else None
    )
    loader = accelerator.prepare(train_loader(data, options, ctx.seed))
    model = accelerator.prepare(module)

    key = "accuracy" if data.eval_labels is not None else "agreement"
    best = BestKeeper(
        student,
        checkpoint_dir,
        lambda folder: save_checkpoint(student, tokenizer, folder),
        writer=accelerator.is_main_process,
        stage="distill",
    )
    loop = Loop(
        model,
        loader,
        accelerator,
        data,
        options,
        best,
        lambda batch: mlm_batch(masker, data, static, batch),
        lambda batch: rtd_batch(replacer, batch),
    )
    curves: dict[str, list[float]] = {}
    history: list[dict[str, Any]] = []
    steps = phases(options)
    named = len(steps) > 1
    total = sum(p.epochs for p in steps)
    epoch, stopped, int8 = 0, False, False
    with contextlib.ExitStack() as simulated:
        for phase in steps:
            if phase.int8:
                # int8 epochs start from the best float epoch (early stopping does not skip them). Their
                # int8 scores are not comparable with float ones, so that epoch is scored again as int8
                # computes it, and an int8 epoch is kept only if it beats that score: quantization-aware
                # training can then cost the artifact nothing on the eval split.
                student.load_state_dict(best.state)
                stopped = False
                int8 = True
                layers = simulated.enter_context(fake_int8(student))
                float_best = max(selectable(history), key=lambda h: h[key])["epoch"]
                baseline = {"epoch": float_best, **evaluate(student, data, options.eval_batch_size)}
                best.restart(baseline[key])
                log.info(
                    "distill: %d int8 epoch(s), %d layers computing as dynamic int8; epoch %d scores %s "
                    "%.4f so, which an int8 epoch must beat to be kept",
                    phase.epochs,
                    layers,
                    float_best,
                    key,
                    baseline[key],
                )
            if stopped:
                break
            loop.start(module, phase)
            # attention maps need the eager kernels; a step that does not compare them keeps the faster ones
            student.set_attn_implementation("eager" if "attention" in phase.terms else implementation)
            for _ in range(phase.epochs):
                epoch += 1
                shown = f" (eval {history[-1][key]:.4f})" if history else ""
                step = f" {phase.name}" if named else ""
                means = loop.epoch(f"distill {epoch}/{total}{step}{shown}")
                for name, value in means.items():
                    curves.setdefault(name, []).append(round(value, 6))
                scores = evaluate(student, data, options.eval_batch_size)
                history.append({"epoch": epoch, **({"phase": phase.name} if named else {}), **scores})
                shown = ", ".join(f"{name} {value:.4f}" for name, value in scores.items())
                log.info("distill epoch %d%s: loss %.4f eval %s", epoch, step, curves["total"][-1], shown)
                if not phase.selects or best.offer(scores[key]):
                    continue
                if options.patience is not None and best.waited >= options.patience:
                    stopped = True
                    break
    student.load_state_dict(best.state)
    student.set_attn_implementation(implementation)
    accelerator.wait_for_everyone()
    # with int8 epochs, the kept epoch is the best of those and the float epoch they started from,
    # all scored as int8 computes them (the float epoch first, so it wins a tie, as BestKeeper keeps it)
    kept = [baseline, *(h for h in history if h["phase"] == "int8")] if int8 else selectable(history)
    best_epoch = max(kept, key=lambda h: h[key])
    metrics = {
        "accuracy": best_epoch.get("accuracy"),
        "agreement": best_epoch["agreement"],
        "kl": best_epoch["kl"],
        "teacher_accuracy": data.teacher_accuracy,
        "best_epoch": best_epoch["epoch"],
        "epochs_run": len(history),
        "loss_curves": curves,
        "eval_curve": history,
        "train_rows": len(data.train_enc),
        "processes": accelerator.num_processes,
        "train_seconds": round(time.time() - start, 2),
    }
    if options.intermediate_epochs:
        metrics["intermediate_epochs"] = options.intermediate_epochs
    if int8:
        metrics["int8_epochs"] = sum(1 for h in history if h["phase"] == "int8")
        metrics["int8_start"] = baseline
        metrics["int8_kept"] = best_epoch is not baseline
    info = {"layer_map": [list(p) for p in pairs], **data.info}
    return DistillOutcome(metrics, info, accelerator.is_main_process)
