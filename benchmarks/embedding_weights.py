"""What the factorised embedding costs before any recovery: uniform against frequency-weighted SVD.

For each task, each model (the ``../shared`` teacher, and any distilled student folder given with
``--student TASK=FOLDER``) and each rank E, the share stage's first transforms are applied as the headline
recipe applies them (vocabulary pruned to the training text, position table cut to 128), then the word
table is factorised to V×E + E×H twice: by the plain truncated SVD (``share.embedding_weights: uniform``)
and by the SVD weighted by each token's count in the training text (``frequency``, the default). Each
model is measured on the suite's held-out training rows (the same 10%-at-most-500 split benchmarks/suite.py
makes, seed 0), the only numbers a choice may use: accuracy, agreement with and KL divergence from the same
model before factorising. Dev accuracy is measured once per row, never chosen on.

    python benchmarks/embedding_weights.py --shared ../shared --tasks sst2 mrpc --ranks 128 256 \\
        --student mrpc=runs/benchmarks-headline/mrpc/runs/mrpc-distil3/01-distill \\
        --out benchmarks/results/embedding_weights
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if not __package__:  # run as ``python benchmarks/embedding_weights.py``: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.embedding_bits import COLUMNS, parse_students, shown, task_splits, write_results

MAX_LENGTH = 128


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", type=Path, required=True, help="the ../shared folder (data/ and models/)")
    p.add_argument("--tasks", nargs="+", default=["sst2", "mrpc"], choices=sorted(COLUMNS))
    p.add_argument("--ranks", nargs="+", type=int, default=[128])
    p.add_argument("--holdout", type=int, default=500, help="held-out training rows, as benchmarks/suite.py")
    p.add_argument(
        "--student",
        action="append",
        default=[],
        metavar="TASK=FOLDER",
        help="also measure a distilled student checkpoint of TASK (repeatable)",
    )
    p.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    return p.parse_args(argv)


def measure_task(task: str, models: list[Path], ranks: list[int], args: argparse.Namespace) -> list[dict]:
    import torch

    from compress.models import load_classifier
    from compress.share.factorize import factorize_embedding, frequency_weights
    from compress.share.positions import trim_positions
    from compress.share.vocab import prune_vocabulary, token_counts
    from compress.training import classification_metrics, encode, predict_logits

    train, heldout, dev = task_splits(args.shared, task, args.holdout)

    def prepared(folder: Path):
        model, tokenizer = load_classifier(folder)
        model.eval()
        tokenizer, _ = prune_vocabulary(model, tokenizer, train.texts, train.pairs)
        trim_positions(model, tokenizer, MAX_LENGTH)
        return model, tokenizer

    def logits(model, tokenizer, split):
        return predict_logits(model, encode(tokenizer, split, MAX_LENGTH))

    rows = []
    for folder in models:
        model, tokenizer = prepared(folder)
        reference = logits(model, tokenizer, heldout)
        base = {"task": task, "model": shown(folder), "heldout_rows": len(heldout), "dev_rows": len(dev)}
        rows.append(
            {
                **base,
                "rank": None,
                "weights": None,
                "heldout": classification_metrics(reference, heldout.labels),
                "dev_accuracy": classification_metrics(logits(model, tokenizer, dev), dev.labels)["accuracy"],
            }
        )
        counts = token_counts(tokenizer, train.texts, train.pairs)
        for rank in ranks:
            for weights in ("uniform", "frequency"):
                model, tokenizer = prepared(folder)
                rows_of = model.get_input_embeddings().num_embeddings
                row_weights = frequency_weights(counts, rows_of) if weights == "frequency" else None
                quality = factorize_embedding(model, rank, row_weights)
                with torch.no_grad():
                    held_logits = logits(model, tokenizer, heldout)
                    dev_logits = logits(model, tokenizer, dev)
                rows.append(
                    {
                        **base,
                        "rank": rank,
                        "weights": weights,
                        "heldout": classification_metrics(held_logits, heldout.labels, reference),
                        "dev_accuracy": classification_metrics(dev_logits, dev.labels)["accuracy"],
                        **quality,
                    }
                )
                h = rows[-1]["heldout"]
                print(
                    f"{task} {folder.name} E={rank} {weights}: held-out {h['accuracy']:.4f}, "
                    f"kl {h['kl']:.4f}",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def markdown(rows: list[dict], command: str) -> str:
    out = [
        "# Factorised embedding before recovery: uniform vs frequency-weighted SVD",
        "",
        f"Command: `{command}`",
        "",
        "Vocabulary pruned to the training text and positions cut to 128 first, as the headline recipe",
        "does; no training after the factorisation. Held-out = the suite's held-out training rows (choices",
        "use these); agreement and KL are against the same model before factorising. Dev is measured once,",
        "never chosen on.",
        "",
        "| task | model | E | SVD weights | held-out acc | agreement | KL, nats | dev acc "
        "| rel. error (fitted norm) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        h = r["heldout"]
        if r["rank"] is None:
            out.append(
                f"| {r['task']} | {r['model']} | not factorised | – | {h['accuracy']:.4f} | – | – "
                f"| {r['dev_accuracy']:.4f} | – |"
            )
            continue
        out.append(
            f"| {r['task']} | {r['model']} | {r['rank']} | {r['weights']} | {h['accuracy']:.4f} "
            f"| {h['agreement']:.4f} | {h['kl']:.4f} | {r['dev_accuracy']:.4f} | {r['relative_error']:.3f} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    students: dict[str, list[Path]] = {}
    for task, folder in parse_students(args.student):
        students.setdefault(task, []).append(folder)
    torch.manual_seed(0)
    start = time.time()
    rows = []
    for task in args.tasks:
        teacher = args.shared / "models" / f"minilm-l6-{task}"
        rows += measure_task(task, [teacher, *students.get(task, [])], args.ranks, args)
    command = "python benchmarks/embedding_weights.py " + " ".join(
        ["--shared ../shared", "--tasks", *args.tasks, "--ranks", *map(str, args.ranks)]
        + [f"--student {t}=…/{shown(p)}" for t, ps in students.items() for p in ps]
    )
    write_results(args.out, command, time.time() - start, rows, markdown(rows, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
