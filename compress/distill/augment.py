"""TinyBERT-style data augmentation: new sentences by swapping words for similar ones, phrases cut
from the sentences, or (pair tasks) new pairs of the task's own sentences.

A small task set gives the student too few chances to see how the teacher behaves; variants of
each sentence with some words replaced (by a masked LM's guesses in context, or by neighbours in
the teacher's word-embedding space), contiguous spans of its words (``method: spans``), or, for
pair tasks, each first text matched with other rows' second texts that share its words (``method:
pairs``), widen it cheaply. The new rows have no gold label: the
teacher labels them through the cached logits. Only words that are one token are replaced;
the rest of the text is kept character for character.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from compress.data import Split
from compress.distill.config import AugmentOptions
from compress.distill.proposer import REPORT, fit_proposer
from compress.errors import DataError, ModelError
from compress.io import atomic_path, sha256_json
from compress.terminal import progress

Slot = tuple[int, int, int]
"""(start char, end char, token id) of a one-token word."""


def word_tokens(tokenizer: Any) -> torch.Tensor:
    """Ids of vocabulary entries that are whole alphabetic words (candidate replacements)."""
    special = set(tokenizer.all_special_ids)
    keep = []
    for token, idx in tokenizer.get_vocab().items():
        text = tokenizer.convert_tokens_to_string([token]).strip()
        if idx not in special and not token.startswith("##") and text.isalpha():
            keep.append(idx)
    return torch.tensor(sorted(keep), dtype=torch.long)


def slots(tokenizer: Any, text: str, words: set[int]) -> list[Slot]:
    """The one-token alphabetic words of ``text`` with their character spans."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    groups: dict[int, list[int]] = {}
    for position, word in enumerate(enc.word_ids()):
        if word is not None:
            groups.setdefault(word, []).append(position)
    out = []
    for positions in groups.values():
        token = enc["input_ids"][positions[0]]
        if len(positions) == 1 and token in words:
            start, end = enc["offset_mapping"][positions[0]]
            out.append((start, end, token))
    return out


@torch.no_grad()
def embedding_neighbours(
    embeddings: torch.Tensor, ids: list[int], words: torch.Tensor, k: int
) -> dict[int, list[int]]:
    """The ``k`` word tokens closest (cosine) to each id in the embedding matrix, itself excluded."""
    unit = torch.nn.functional.normalize(embeddings.float(), dim=-1)
    out: dict[int, list[int]] = {}
    for chunk in torch.tensor(ids, dtype=torch.long).split(512):
        sims = unit[chunk] @ unit[words].T
        sims[words[None, :] == chunk[:, None]] = -2.0
        top = sims.topk(min(k, len(words) - 1), dim=-1).indices
        out.update({i: words[row].tolist() for i, row in zip(chunk.tolist(), top, strict=True)})
    return out


@torch.no_grad()
def mlm_candidates(
    mlm: Any, tokenizer: Any, text: str, spans: list[Slot], words: torch.Tensor, k: int
) -> list[list[int]]:
    """For each slot, the masked LM's top-``k`` word tokens in context (one masked copy per slot)."""
    if not spans:
        return []
    enc = tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
    starts = [s for s, _ in enc["offset_mapping"][0].tolist()]
    ids = enc["input_ids"].repeat(len(spans), 1)
    for row, (start, _, _) in enumerate(spans):
        ids[row, starts.index(start, 1)] = tokenizer.mask_token_id
    logits = mlm(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    allowed = torch.full((logits.shape[-1],), float("-inf"))
    allowed[words[words < logits.shape[-1]]] = 0.0
    masked = ids == tokenizer.mask_token_id
    picks = (logits[masked] + allowed).topk(k + 1, dim=-1).indices.tolist()
    return [[c for c in row if c != tok][:k] for row, (_, _, tok) in zip(picks, spans, strict=True)]


def load_mlm(folder: Path) -> Any:
    """A masked-LM checkpoint (safetensors only) whose vocabulary matches the teacher's tokenizer."""
    from transformers import AutoModelForMaskedLM

    from compress.model_folder import check_model_folder

    check_model_folder(folder)
    try:
        return AutoModelForMaskedLM.from_pretrained(str(folder), use_safetensors=True).eval()
    except Exception as exc:
        raise ModelError(
            f"augment.mlm_model: {folder} cannot be loaded as a masked LM ({type(exc).__name__}); "
            "point it at a *ForMaskedLM checkpoint with the teacher's vocabulary"
        ) from None


def variant(text: str, spans: list[Slot], choices: list[list[str]], prob: float, rng: random.Random) -> str:
    """``text`` with each slot replaced, with probability ``prob``, by one of its candidates."""
    out, last = [], 0
    for (start, end, _), cands in zip(spans, choices, strict=True):
        if cands and rng.random() < prob:
            out += [text[last:start], rng.choice(cands)]
            last = end
    return "".join([*out, text[last:]])


def span_variants(text: str, count: int, rng: random.Random) -> list[str]:
    """``count`` contiguous word spans of ``text`` (at least two words, shorter than the text): real
    phrases of real sentences, the way SST-2's phrase-level training set was cut from its sentences,
    so the teacher is asked about text as natural as the task's own. A text of under three words
    comes back as itself."""
    words = text.split()
    if len(words) < 3:
        return [text] * count
    out = []
    for _ in range(count):
        length = rng.randint(2, len(words) - 1)
        start = rng.randint(0, len(words) - length)
        out.append(" ".join(words[start : start + length]))
    return out


WORD = re.compile(r"\w+")


def tfidf(docs: list[Counter[str]], vocab: dict[str, int], idf: list[float]) -> torch.Tensor:
    """Sparse rows of L2-normalised TF-IDF weights, one per document."""
    rows, cols, vals = [], [], []
    for r, doc in enumerate(docs):
        weights = {vocab[w]: n * idf[vocab[w]] for w, n in doc.items()}
        norm = math.sqrt(sum(v * v for v in weights.values())) or 1.0
        for c, v in weights.items():
            rows.append(r)
            cols.append(c)
            vals.append(v / norm)
    return torch.sparse_coo_tensor(
        torch.tensor([rows, cols], dtype=torch.long).reshape(2, -1),
        torch.tensor(vals, dtype=torch.float32),
        (len(docs), len(vocab)),
        check_invariants=True,
    ).coalesce()


@torch.no_grad()
def neighbour_pairs(
    texts: list[str], pairs: list[str], count: int, chunk: int = 256
) -> tuple[list[list[str]], list[list[str]]]:
    """Per row i, up to ``count`` new pairs ``(texts[i], pairs[j])``: the second texts of other rows
    that share the most words with ``texts[i]`` (TF-IDF cosine over lowercased words, ties to the
    lower j). A candidate equal to row i's own second text or to ``texts[i]`` itself is skipped, so
    no new pair repeats a row or pairs a sentence with itself. Deterministic: the text decides."""
    docs_a = [Counter(WORD.findall(t.lower())) for t in texts]
    docs_b = [Counter(WORD.findall(t.lower())) for t in pairs]
    df: Counter[str] = Counter(w for doc in docs_a + docs_b for w in doc)
    vocab = {w: i for i, w in enumerate(df)}
    n_docs = len(docs_a) + len(docs_b)
    idf = [math.log((1 + n_docs) / (1 + df[w])) + 1 for w in vocab]
    a = tfidf(docs_a, vocab, idf)
    b = tfidf(docs_b, vocab, idf)
    ids: dict[str, int] = {}
    second = torch.tensor([ids.setdefault(t, len(ids)) for t in pairs])
    first = torch.tensor([ids.setdefault(t, len(ids)) for t in texts])
    k = min(count, len(pairs))
    out_a: list[list[str]] = []
    out_b: list[list[str]] = []
    for start in progress(range(0, len(texts), chunk), desc="augment: neighbour pairs", leave=False):
        stop = min(start + chunk, len(texts))
        block = torch.sparse.mm(b, a.index_select(0, torch.arange(start, stop)).to_dense().T).T
        own = second[start:stop, None]
        blocked = (second[None, :] == own) | (second[None, :] == first[start:stop, None])
        block[blocked] = -math.inf
        scores, picks = torch.sort(block, dim=1, descending=True, stable=True)
        scores, picks = scores[:, :k], picks[:, :k]
        for r, (row_scores, row_picks) in enumerate(zip(scores.tolist(), picks.tolist(), strict=True)):
            chosen = [pairs[j] for s, j in zip(row_scores, row_picks, strict=True) if s != -math.inf]
            out_a.append([texts[start + r]] * len(chosen))
            out_b.append(chosen)
    return out_a, out_b


def augment_texts(
    texts: list[str],
    tokenizer: Any,
    teacher: Any,
    options: AugmentOptions,
    seed: int,
    mlm_folder: Path | None = None,
) -> list[list[str]]:
    """``multiplier`` variants of every text (a variant may equal the text when it has no slot).

    ``mlm_folder``: the masked LM of ``method: mlm`` (default: ``options.mlm_model``).
    """
    if options.method == "spans":
        rng = random.Random(seed)
        return [span_variants(text, options.multiplier, rng) for text in texts]
    words = word_tokens(tokenizer)
    wordset = set(words.tolist())
    spans = [slots(tokenizer, t, wordset) for t in progress(texts, desc="augment: word slots", leave=False)]
    if options.method == "mlm":
        mlm = load_mlm(Path(mlm_folder or options.mlm_model))
        cand_ids = [
            mlm_candidates(mlm, tokenizer, t, s, words, options.candidates)
            for t, s in progress(
                zip(texts, spans, strict=True), total=len(texts), desc="augment: MLM", leave=False
            )
        ]
    else:
        used = sorted({tok for s in spans for _, _, tok in s})
        near = embedding_neighbours(teacher.get_input_embeddings().weight, used, words, options.candidates)
        cand_ids = [[near[tok] for _, _, tok in s] for s in spans]
    strings = {
        i: tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(i)]).strip()
        for i in {c for rows in cand_ids for row in rows for c in row}
    }
    rng = random.Random(seed)
    out = []
    for text, s, rows in zip(texts, spans, cand_ids, strict=True):
        choices = [[strings[c] for c in row] for row in rows]
        out.append([variant(text, s, choices, options.replace_prob, rng) for _ in range(options.multiplier)])
    return out


def swapped(texts: list[str], pairs: list[str], rows: dict[str, Any]) -> dict[str, list[str]]:
    """``rows`` (the variants) plus the original pairs and the variants, each second text first."""
    first = texts + (rows["texts"] if rows["pairs"] is not None else [])
    second = pairs + (rows["pairs"] or [])
    return {"texts": rows["texts"] + second, "pairs": (rows["pairs"] or []) + first}


def augment_split(
    split: Split,
    tokenizer: Any,
    teacher: Any,
    options: AugmentOptions,
    *,
    seed: int,
    cache_dir: Path,
    teacher_sha: str,
) -> Split:
    """The unlabelled augmented rows for ``split`` (not including the originals), cached as JSON."""
    if options.swap_pairs and split.pairs is None:
        raise DataError(
            "distill.augment.swap_pairs: the task has no second text to swap (task.text_pair is unset); "
            "remove swap_pairs (and set multiplier >= 1 if it is 0)"
        )
    if options.method == "pairs" and split.pairs is None:
        raise DataError(
            "distill.augment.method: pairs needs a pair task (task.text_pair is unset); "
            "use method: embedding or spans for single texts"
        )
    key = sha256_json([split.sha256, options.model_dump(), seed, teacher_sha])
    path = Path(cache_dir) / "distill" / f"augment-{key[:24]}.json"
    if path.is_file():
        rows = json.loads(path.read_text(encoding="utf-8"))
    else:
        mlm_folder = None
        if options.method == "mlm" and not options.mlm_model:
            fit_key = sha256_json([split.sha256, options.proposer.model_dump(), seed, teacher_sha])
            mlm_folder = Path(cache_dir) / "distill" / f"proposer-{fit_key[:24]}"
            if not (mlm_folder / REPORT).is_file():
                fit_proposer(
                    teacher, tokenizer, split.texts + (split.pairs or []), options.proposer, seed, mlm_folder
                )
        texts, pairs = [[] for _ in split.texts], None
        if options.multiplier and options.method == "pairs":
            texts, pairs = neighbour_pairs(split.texts, split.pairs, options.multiplier)
        elif options.multiplier:
            texts = augment_texts(split.texts, tokenizer, teacher, options, seed, mlm_folder)
            if split.pairs is not None:
                pairs = augment_texts(split.pairs, tokenizer, teacher, options, seed + 1, mlm_folder)
        rows = {
            "texts": [v for vs in texts for v in vs],
            "pairs": [v for vs in pairs for v in vs] if pairs is not None else None,
        }
        if options.swap_pairs:
            rows = swapped(split.texts, split.pairs, rows)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(rows), encoding="utf-8")
    return Split(
        texts=rows["texts"],
        pairs=rows["pairs"],
        labels=None,
        label_names=split.label_names,
        source=f"augmented({split.source}) x{options.multiplier}",
        sha256=sha256_json([path.name]),
    )
