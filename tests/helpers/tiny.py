"""Tiny models and data built in code, so tests run in seconds with no network."""

from __future__ import annotations

import random
from pathlib import Path

POSITIVE = ["good", "great", "lovely", "excellent", "fine", "superb", "happy", "tasty", "fast", "friendly"]
NEGATIVE = ["bad", "awful", "poor", "terrible", "slow", "rude", "broken", "bland", "noisy", "sad"]
NOUNS = ["phone", "film", "meal", "hotel", "service", "screen", "battery", "staff", "room", "book"]
FILLER = ["the", "was", "really", "very", "a", "and", "it", "this", "is", "so", "not", "at", "all"]


def vocab_words() -> list[str]:
    return sorted(set(POSITIVE + NEGATIVE + NOUNS + FILLER))


def make_tiny_bert(
    folder: Path,
    *,
    num_labels: int = 2,
    layers: int = 2,
    hidden: int = 32,
    seed: int = 0,
    model_type: str = "bert",
) -> Path:
    """Save a randomly initialised tiny classifier + WordPiece tokenizer into ``folder``."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = specials + vocab_words() + letters + [f"##{c}" for c in letters] + [".", ",", "!", "'", '"']
    tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=hidden * 2,
        max_position_embeddings=128,
        num_labels=num_labels,
        id2label={i: f"l{i}" for i in range(num_labels)},
    )
    model = BertForSequenceClassification(config)
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    return folder


def review_rows(n: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % 2
        cue = rng.choice(POSITIVE if label else NEGATIVE)
        words = [rng.choice(FILLER), rng.choice(NOUNS), rng.choice(FILLER), cue, rng.choice(FILLER)]
        rng.shuffle(words)
        rows.append((" ".join(words), label))
    return rows


def write_reviews(folder: Path, sizes: tuple[int, int, int] = (96, 32, 32)) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, n, seed in zip(("train", "dev", "test"), sizes, (1, 2, 3), strict=False):
        path = folder / f"{name}.tsv"
        path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in review_rows(n, seed)))
        out[name] = path
    return out


def write_recipe(
    path: Path, *, teacher: Path, data: dict[str, Path], stages: str, extra: str = "", report: bool = False
) -> Path:
    """A recipe for the tiny model and data; ``stages`` is the YAML list body.

    The final evaluation (latency in fresh processes) is off unless ``report`` or ``extra`` asks for
    it, so that pipeline tests spend their time on what they test."""
    if not report and "evaluate:" not in extra and "gates:" not in extra:
        extra = f"evaluate: {{enabled: false}}\n{extra}"
    path.write_text(f"""name: tiny
seed: 0
task: {{text: sentence, label: label, labels: [negative, positive], max_length: 16}}
teacher: {{path: {teacher}}}
data:
  train: {{path: {data["train"]}}}
  eval: {{path: {data["dev"]}}}
  test: {{path: {data["test"]}}}
stages:
{stages}
{extra}""")
    return path
