"""A masked-LM word proposer for augmentation, fitted on the teacher's own encoder over the task's text.

TinyBERT proposes replacement words with a pretrained BERT masked LM. None can be downloaded here, and
the teacher is a classifier without an MLM head, so one is fitted: a copy of the teacher with a fresh
MLM head (its decoder tied to the teacher's word embeddings, so every word keeps the teacher's own
representation), its top ``train_layers`` encoder layers trained with the head under dynamic,
whole-word masking (RoBERTa, BERT-wwm) over the training text. It is ELECTRA's small generator by
another name. Nothing of the teacher changes, and torch's global random state is left as it was.
"""

from __future__ import annotations

import copy
import json
import logging
import random
from pathlib import Path
from typing import Any

import torch

from compress.distill.config import ProposerOptions
from compress.distill.losses import Masker, mlm_model
from compress.io import atomic_dir
from compress.terminal import progress

log = logging.getLogger(__name__)

MAX_LENGTH = 128
"""Longest text the proposer trains on (augmented words are short-context decisions)."""
REPORT = "proposer.json"


def trainable(model: Any, train_layers: int) -> list[torch.nn.Parameter]:
    """Freeze everything but the MLM head and the top ``train_layers`` encoder layers; return the rest.

    The decoder is tied to the word embeddings, which stay frozen: the head learns to map hidden
    states onto the teacher's own word vectors.
    """
    from compress.share.tying import encoder_layers

    for param in model.parameters():
        param.requires_grad_(False)
    layers = list(encoder_layers(model))
    head = [m for name, m in model.named_children() if name != model.base_model_prefix]
    for module in [*head, *layers[max(0, len(layers) - train_layers) :]]:
        for param in module.parameters():
            param.requires_grad_(True)
    model.get_input_embeddings().weight.requires_grad_(False)
    return [p for p in model.parameters() if p.requires_grad]


def batches(
    tokenizer: Any, texts: list[str], size: int, rng: random.Random | None
) -> list[dict[str, torch.Tensor]]:
    order = list(range(len(texts)))
    if rng is not None:
        rng.shuffle(order)
    out = []
    for start in range(0, len(order), size):
        chunk = [texts[i] for i in order[start : start + size]]
        out.append(
            tokenizer(
                chunk,
                truncation=True,
                max_length=MAX_LENGTH,
                padding="longest",
                return_offsets_mapping=True,
                return_tensors="pt",
            )
        )
    return out


def masked_step(model: Any, masker: Masker, enc: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int, int]:
    """(loss, masked tokens, correctly predicted masked tokens) for one batch."""
    ids, labels = masker(enc["input_ids"], enc["offset_mapping"])
    logits = model(input_ids=ids, attention_mask=enc["attention_mask"]).logits
    chosen = labels != -100
    if not chosen.any():
        return logits.sum() * 0.0, 0, 0
    loss = torch.nn.functional.cross_entropy(logits[chosen], labels[chosen])
    correct = int((logits[chosen].argmax(-1) == labels[chosen]).sum())
    return loss, int(chosen.sum()), correct


def fit_proposer(
    teacher: Any, tokenizer: Any, texts: list[str], options: ProposerOptions, seed: int, folder: Path
) -> dict[str, Any]:
    """Fit the proposer on ``texts`` and save it (safetensors) with its held-out accuracy at ``folder``."""
    from transformers import get_linear_schedule_with_warmup

    rng = random.Random(seed)
    order = list(range(len(texts)))
    rng.shuffle(order)
    held = max(1, int(len(texts) * options.holdout)) if options.holdout and len(texts) > 1 else 0
    fit_texts = [texts[i] for i in order[held:]]
    held_texts = [texts[i] for i in order[:held]]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = mlm_model(copy.deepcopy(teacher).float())
        if getattr(model.base_model, "pooler", None) is not None:
            model.base_model.pooler = None  # a masked LM has none; saved, it would be an unexpected key
        params = trainable(model, options.train_layers)
        masker = Masker(tokenizer, options.masking, seed)
        optimizer = torch.optim.AdamW(params, lr=options.lr, weight_decay=0.01)
        steps = options.epochs * -(-len(fit_texts) // options.batch_size)
        schedule = get_linear_schedule_with_warmup(optimizer, int(0.06 * steps), steps)
        model.train()
        with progress(total=steps, desc="augment: fit MLM proposer", leave=False) as bar:
            for _ in range(options.epochs):
                for enc in batches(tokenizer, fit_texts, options.batch_size, rng):
                    loss, _, _ = masked_step(model, masker, enc)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(params, 1.0)
                    optimizer.step()
                    schedule.step()
                    optimizer.zero_grad(set_to_none=True)
                    bar.set_postfix(loss=f"{loss.item():.3f}")
                    bar.update()
        model.eval()
        total = correct = 0
        with torch.no_grad():
            for enc in batches(tokenizer, held_texts, 64, None):
                _, n, ok = masked_step(model, masker, enc)
                total, correct = total + n, correct + ok
    report = {
        "fit_texts": len(fit_texts),
        "heldout_texts": len(held_texts),
        "heldout_masked_tokens": total,
        "heldout_top1": round(correct / total, 4) if total else None,
        "options": options.model_dump(),
        "seed": seed,
    }
    log.info(
        "augment: MLM proposer fitted on %d texts; held-out masked-token top-1 %s",
        len(fit_texts),
        report["heldout_top1"],
    )
    with atomic_dir(folder) as out:
        model.save_pretrained(out, safe_serialization=True)
        (out / REPORT).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return report
