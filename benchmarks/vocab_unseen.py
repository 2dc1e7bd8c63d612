"""What vocabulary pruning costs on text the training set never had, and what aliasing would win back.

The share stage keeps the tokens the training text uses (``share.vocab``). A held-out or dev sentence
with a word the training text never had is then tokenised differently: WordPiece splits the word into
smaller kept pieces. The alternative measured here keeps the tokenisation the model was trained on and
reads each dropped token through the kept row nearest to its own (cosine of the model's word-embedding
rows), which is what an id map in front of the pruned table would compute. No training follows; each
row is measured on the suite's held-out training rows (the same 10%-at-most-500 split benchmarks/suite.py
makes, seed 0), the numbers a choice may use: accuracy, agreement with and KL divergence from the unpruned
model. Dev accuracy is measured once per row, never chosen on.

    python benchmarks/vocab_unseen.py --shared ../shared \\
        --student sst2=runs/rerun/sst2/runs/sst2-distil3/01-distill \\
        --student mrpc=runs/rerun/mrpc/runs/mrpc-distil3/01-distill \\
        --out benchmarks/results/vocab_unseen
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as ``python benchmarks/vocab_unseen.py``: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.embedding_bits import parse_students, shown, task_splits, write_results

MAX_LENGTH = 128
VARIANTS = (
    "unpruned",
    "pruned: unseen words split into kept pieces",
    "aliased: dropped tokens read the nearest kept row",
)


def nearest_kept(table: Any, kept: list[int]) -> dict[int, int]:
    """For every row of ``table`` (a [vocab, width] tensor) not in ``kept``, the kept row with the
    highest cosine similarity to it."""
    import torch

    kept_ids = torch.tensor(sorted(kept))
    dropped = torch.tensor(sorted(set(range(table.shape[0])) - set(kept)), dtype=torch.long)
    if not len(dropped):
        return {}
    normed = torch.nn.functional.normalize(table.detach().float(), dim=-1)
    best = (normed[dropped] @ normed[kept_ids].T).argmax(-1)
    return dict(zip(dropped.tolist(), kept_ids[best].tolist(), strict=True))


def alias_rows(model: Any, kept: list[int]) -> int:
    """Overwrite each dropped token's word-embedding row of ``model`` with its nearest kept row (in
    place); the tokenizer stays whole. Returns how many rows were aliased."""
    import torch

    table = model.get_input_embeddings().weight
    aliases = nearest_kept(table, kept)
    if aliases:
        with torch.no_grad():
            table[torch.tensor(list(aliases))] = table[torch.tensor(list(aliases.values()))].clone()
    return len(aliases)


def measure_task(task: str, folder: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    from compress.models import load_classifier
    from compress.share.vocab import kept_token_ids, prune_vocabulary, used_token_ids
    from compress.training import classification_metrics, encode, predict_logits

    train, heldout, dev = task_splits(args.shared, task, args.holdout)

    def logits(model: Any, tokenizer: Any, split: Any) -> Any:
        return predict_logits(model, encode(tokenizer, split, MAX_LENGTH))

    model, tokenizer = load_classifier(folder)
    model.eval()
    reference = logits(model, tokenizer, heldout)
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    kept = kept_token_ids(data, used_token_ids(tokenizer, train.texts, train.pairs))
    base = {"task": task, "model": shown(folder), "heldout_rows": len(heldout), "dev_rows": len(dev)}
    rows = []
    for variant in VARIANTS:
        model, tokenizer = load_classifier(folder)
        model.eval()
        extra: dict[str, Any] = {"vocab_rows": model.get_input_embeddings().num_embeddings}
        if variant.startswith("pruned"):
            tokenizer, sizes = prune_vocabulary(model, tokenizer, train.texts, train.pairs)
            extra = {"vocab_rows": sizes["vocab_after"]}
        elif variant.startswith("aliased"):
            extra = {"vocab_rows": len(kept), "aliased_tokens": alias_rows(model, kept)}
        held_logits, dev_logits = logits(model, tokenizer, heldout), logits(model, tokenizer, dev)
        h = classification_metrics(held_logits, heldout.labels, reference)
        dev_accuracy = classification_metrics(dev_logits, dev.labels)["accuracy"]
        rows.append({**base, "variant": variant, **extra, "heldout": h, "dev_accuracy": dev_accuracy})
        print(f"{task} {variant}: held-out {h['accuracy']:.4f}, kl {h['kl']:.4f}", file=sys.stderr)
    return rows


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    out = [
        "# Vocabulary pruning on unseen text: split into pieces, or alias to the nearest kept row",
        "",
        f"Command: `{command}`",
        "",
        "The distilled student before any share transform but the vocabulary; no training afterwards.",
        "Held-out = the suite's held-out training rows (choices use these); agreement and KL are against the",
        "unpruned model. Dev is measured once, never chosen on.",
        "",
        "| task | model | variant | rows of the word table | held-out acc | agreement | KL, nats | dev acc |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        h = r["heldout"]
        out.append(
            f"| {r['task']} | {r['model']} | {r['variant']} | {r['vocab_rows']:,} | {h['accuracy']:.4f} "
            f"| {h['agreement']:.4f} | {h['kl']:.4f} | {r['dev_accuracy']:.4f} |"
        )
    return "\n".join(out) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", type=Path, required=True, help="the ../shared folder (data/ and models/)")
    p.add_argument(
        "--student",
        action="append",
        required=True,
        metavar="TASK=FOLDER",
        help="a distilled student checkpoint of TASK (repeatable)",
    )
    p.add_argument("--holdout", type=int, default=500, help="held-out training rows, as benchmarks/suite.py")
    p.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    students = parse_students(args.student)
    torch.manual_seed(0)
    start = time.time()
    rows = [row for task, folder in students for row in measure_task(task, folder, args)]
    command = "python benchmarks/vocab_unseen.py --shared ../shared " + " ".join(
        f"--student {task}=…/{shown(folder)}" for task, folder in students
    )
    write_results(args.out, command, time.time() - start, rows, markdown(rows, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
