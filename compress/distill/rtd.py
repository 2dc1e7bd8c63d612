"""ELECTRA's replaced-token detection (Clark et al. 2020) as a distillation term.

Masked-LM learns from the 15% of tokens that are masked; replaced-token detection learns from every
token: some words of a transfer row are swapped for plausible others and the student tells, token by
token, which ones were. A swappable token is an alphabetic vocabulary entry that starts a word: a whole
word, or the first piece of a word the tokenizer splits (continuation pieces, ``##…``, are never swapped).
ELECTRA draws the swaps from a small masked-LM generator; here they come from
each word's nearest neighbours in the student's word-embedding space (the words the embedding-neighbour
augmentation proposes), so a swap is a word of the same kind and telling it apart takes the context.
The swaps are drawn anew every time a row is seen (dynamic, like RoBERTa's masking). The detection head
(transformers' ``ElectraDiscriminatorPredictions``) trains beside the student and is not saved with it.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

from compress.distill.augment import embedding_neighbours, word_tokens
from compress.distill.config import RtdOptions
from compress.errors import RecipeError

IGNORE = -100


def detection_head(config: Any) -> torch.nn.Module:
    """ELECTRA's discriminator head (dense, activation, one logit per token) at the student's width."""
    from transformers.models.electra.modeling_electra import ElectraDiscriminatorPredictions

    act = getattr(config, "hidden_act", None) or getattr(config, "activation", None) or "gelu"
    return ElectraDiscriminatorPredictions(SimpleNamespace(hidden_size=config.hidden_size, hidden_act=act))


def rtd_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of replaced (1) against original (0) over labelled tokens (-100: padding and
    special tokens)."""
    keep = labels != IGNORE
    if not keep.any():
        return logits.sum() * 0.0
    return F.binary_cross_entropy_with_logits(logits[keep], labels[keep].to(logits.dtype))


class Replacer:
    """Swaps word tokens for embedding neighbours and labels every real token replaced or not."""

    def __init__(
        self, tokenizer: Any, embeddings: torch.Tensor, options: RtdOptions, seed: int, seen: torch.Tensor
    ):
        """``seen``: the transfer set's token ids; neighbours are computed for the word tokens among them."""
        words = word_tokens(tokenizer)
        words = words[words < embeddings.shape[0]]
        present = sorted(set(seen.unique().tolist()) & set(words.tolist()))
        if len(words) <= options.candidates:
            raise RecipeError(
                f"rtd: the vocabulary has {len(words)} whole-word tokens; replaced-token detection needs "
                f"more than rtd.candidates ({options.candidates}) to swap in; lower rtd.candidates or set "
                "weights.rtd: 0"
            )
        if not present:
            raise RecipeError(
                "rtd: the transfer set has no token that is a vocabulary word, so there is nothing to swap; "
                "set weights.rtd: 0"
            )
        neighbours = embedding_neighbours(embeddings, present, words, options.candidates)
        self.table = torch.full((embeddings.shape[0], options.candidates), -1, dtype=torch.long)
        for token, row in neighbours.items():
            self.table[token] = torch.tensor(row, dtype=torch.long)
        self.special = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
        self.rate = options.rate
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids with about ``rate`` of the swappable word tokens replaced, labels: 1 replaced, 0 kept,
        -100 at padding and special tokens)."""
        ids = input_ids.cpu()
        real = attention_mask.cpu().bool() & ~torch.isin(ids, self.special)
        options = self.table[ids.clamp(0, len(self.table) - 1)]
        pick = torch.randint(0, options.shape[-1], ids.shape, generator=self.generator)
        replacement = options.gather(-1, pick[..., None]).squeeze(-1)
        draw = torch.rand(ids.shape, generator=self.generator) < self.rate
        chosen = real & draw & (replacement >= 0)
        corrupted = torch.where(chosen, replacement, ids)
        labels = chosen.long().masked_fill(~real, IGNORE)
        return corrupted.to(input_ids.device), labels.to(input_ids.device)


def word_embeddings(student: Any) -> torch.Tensor:
    """The student's input word table (V x H), for neighbours; a factorised table gives the product of its
    factors."""
    table = student.get_input_embeddings()
    if isinstance(table, torch.nn.Embedding):
        return table.weight.detach()
    dense = getattr(table, "dense_weight", None)
    if callable(dense):
        with torch.no_grad():
            return dense().detach()
    raise RecipeError(
        f"weights.rtd: the student's input embeddings are a {type(table).__name__}, neither a word table nor "
        "a factorised one; set weights.rtd: 0"
    )
