"""Vocabulary pruning: keep only the tokens a task's text uses, and a tokenizer that emits the new ids.

A 30k-token table is often half of a small encoder's weights while a task's training text touches a
few thousand tokens. Pruning keeps tokenisation of that text identical: WordPiece's greedy
longest match can only pick a kept piece (the original piece is still there and nothing longer was
added), and BPE keeps every intermediate token of its merge chains, so its merges fire as before.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import torch

from compress.errors import ModelError, RecipeError


def token_counts(tokenizer: Any, texts: list[str], pairs: list[str] | None = None) -> Counter[int]:
    """How often the tokenizer produces each id for the texts, untruncated (long texts count in full)."""
    counts: Counter[int] = Counter()
    for start in range(0, len(texts), 1024):
        chunk_pairs = pairs[start : start + 1024] if pairs is not None else None
        enc = tokenizer(texts[start : start + 1024], chunk_pairs, truncation=False, verbose=False)
        for ids in enc["input_ids"]:
            counts.update(ids)
    return counts


def used_token_ids(tokenizer: Any, texts: list[str], pairs: list[str] | None = None) -> set[int]:
    """Every id the tokenizer produces for the texts, without truncation (long texts count in full)."""
    return set(token_counts(tokenizer, texts, pairs))


def _merge_pairs(model: dict[str, Any]) -> list[tuple[str, str]]:
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1]) for m in model.get("merges", [])]


def _merged(model: dict[str, Any], left: str, right: str) -> str:
    prefix = model.get("continuing_subword_prefix") or ""
    return left + (right[len(prefix) :] if prefix and right.startswith(prefix) else right)


def _bpe_closure(model: dict[str, Any], tokens: set[str]) -> set[str]:
    """Add the parts every kept token is merged from, recursively, so merge chains stay intact."""
    made_from = {_merged(model, a, b): (a, b) for a, b in reversed(_merge_pairs(model))}
    closed, todo = set(tokens), list(tokens)
    while todo:
        for part in made_from.get(todo.pop(), ()):
            if part not in closed:
                closed.add(part)
                todo.append(part)
    return closed


Characters = Literal["seen", "all", "none"]


def _character(token: str, prefix: str) -> str | None:
    """The character a one-character piece stands for (``a`` or ``##a``), else None."""
    if prefix and token.startswith(prefix) and len(token) == len(prefix) + 1:
        return token[-1]
    return token if len(token) == 1 else None


def kept_token_ids(
    data: dict[str, Any],
    used: Iterable[int],
    keep: Iterable[str] = (),
    reserve: int = 0,
    characters: Characters = "seen",
) -> list[int]:
    """Old ids to keep, ascending: used ids, added/special tokens, ``keep``, the first ``reserve`` ids
    (vocabularies list frequent pieces first) and one-character pieces, so that words the training
    text never had still split into pieces instead of [UNK]: ``seen`` keeps those of every character
    the training text's pieces are written in (its alphabet), ``all`` every one, ``none`` none."""
    model = data["model"]
    if model["type"] not in ("WordPiece", "BPE"):
        raise ModelError(
            f"vocabulary pruning supports WordPiece and BPE tokenizers; this one is {model['type']}"
        )
    vocab: dict[str, int] = model["vocab"]
    token_of = {i: t for t, i in vocab.items()}
    added = {t["id"] for t in data.get("added_tokens", []) if t["id"] in token_of}
    used = {i for i in used if i in token_of} - added
    ids = used | added
    prefix = model.get("continuing_subword_prefix") or ""
    ids |= {i for i in range(min(reserve, len(vocab)))}
    if model.get("unk_token") in vocab:
        ids.add(vocab[model["unk_token"]])
    for token in keep:
        if token not in vocab:
            raise RecipeError(f"share.vocab.keep: token {token!r} is not in the tokenizer's vocabulary")
        ids.add(vocab[token])
    if characters != "none":
        alphabet = {c for i in used for c in token_of[i].removeprefix(prefix)}
        ids |= {
            i
            for t, i in vocab.items()
            if (c := _character(t, prefix)) is not None and (characters == "all" or c in alphabet)
        }
    if model["type"] == "BPE":
        ids = {vocab[t] for t in _bpe_closure(model, {token_of[i] for i in ids})}
    return sorted(ids)


def _remap_processor(node: dict[str, Any] | None, remap: dict[int, int]) -> None:
    if not node:
        return
    if node["type"] == "Sequence":
        for child in node["processors"]:
            _remap_processor(child, remap)
    elif node["type"] == "TemplateProcessing":
        for special in node["special_tokens"].values():
            special["ids"] = [remap[i] for i in special["ids"]]
    elif node["type"] in ("BertProcessing", "RobertaProcessing"):
        for key in ("sep", "cls"):
            node[key] = [node[key][0], remap[node[key][1]]]


def prune_tokenizer_json(data: dict[str, Any], kept: list[int]) -> tuple[dict[str, Any], dict[int, int]]:
    """A copy of a ``tokenizer.json`` document with only the ``kept`` ids, renumbered in order."""
    out = json.loads(json.dumps(data))
    remap = {old: new for new, old in enumerate(kept)}
    model = out["model"]
    model["vocab"] = {
        t: remap[i] for t, i in sorted(model["vocab"].items(), key=lambda kv: kv[1]) if i in remap
    }
    if model["type"] == "BPE":
        vocab = model["vocab"]
        model["merges"] = [
            [a, b]
            for a, b in _merge_pairs(data["model"])
            if a in vocab and b in vocab and _merged(model, a, b) in vocab
        ]
    for token in out.get("added_tokens", []):
        token["id"] = remap[token["id"]]
    _remap_processor(out.get("post_processor"), remap)
    if out.get("padding"):
        out["padding"]["pad_id"] = remap[out["padding"]["pad_id"]]
    return out, remap


def pruned_tokenizer(tokenizer: Any, data: dict[str, Any]) -> Any:
    """A transformers tokenizer with the same settings as ``tokenizer`` and the pruned vocabulary."""
    from compress.model_folder import load_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        (Path(tmp) / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        for stale in ("vocab.txt", "vocab.json", "merges.txt"):
            (Path(tmp) / stale).unlink(missing_ok=True)
        return load_tokenizer(Path(tmp))


@torch.no_grad()
def prune_embedding_rows(model: torch.nn.Module, kept: list[int], remap: dict[int, int]) -> None:
    """Keep the embedding rows of ``kept`` (in order) and point the config's token ids at the new rows."""
    from compress.share.factorize import FactorizedEmbedding

    current = model.get_input_embeddings()
    table = current.embed if isinstance(current, FactorizedEmbedding) else current
    pad = remap.get(table.padding_idx) if table.padding_idx is not None else None
    rows = torch.nn.Embedding(len(kept), table.embedding_dim, padding_idx=pad)
    rows.weight.copy_(table.weight[torch.tensor(kept)])
    if isinstance(current, FactorizedEmbedding):
        current.embed = rows
    else:
        model.set_input_embeddings(rows)
    config = model.config
    config.vocab_size = len(kept)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id"):
        if getattr(config, key, None) is not None:
            setattr(config, key, remap.get(getattr(config, key)))


def prune_vocabulary(
    model: torch.nn.Module,
    tokenizer: Any,
    texts: list[str],
    pairs: list[str] | None = None,
    *,
    keep: Iterable[str] = (),
    reserve: int = 0,
    characters: Characters = "seen",
) -> tuple[Any, dict[str, int]]:
    """Prune the vocabulary in place to the tokens of ``texts``; returns the new tokenizer and sizes."""
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(
            "vocabulary pruning needs a fast tokenizer (tokenizer.json); re-save the model with one"
        )
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    kept = kept_token_ids(data, used_token_ids(tokenizer, texts, pairs), keep, reserve, characters)
    new_data, remap = prune_tokenizer_json(data, kept)
    prune_embedding_rows(model, kept, remap)
    return pruned_tokenizer(tokenizer, new_data), {
        "vocab_before": len(data["model"]["vocab"]),
        "vocab_after": len(kept),
    }
