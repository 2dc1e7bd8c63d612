"""Position-table trimming: keep only the position rows the deployment can reach.

BERT-family encoders learn a 512-row absolute position table, but a task run at ``max_length`` 64
never reads row 64 or later. Dropping those rows changes nothing for inputs up to the kept length
(every forward pass indexes rows 0..length-1; RoBERTa-style tables are offset by padding_idx + 1)
and saves (512 - N) x H parameters. The config's ``max_position_embeddings`` follows, so the
checkpoint stays a plain Hugging Face model and exporters size their inputs from it.
"""

from __future__ import annotations

from typing import Any

import torch

from compress.errors import ModelError, RecipeError


def _embeddings(model: torch.nn.Module) -> torch.nn.Module:
    base = getattr(model, "base_model", model)
    embeddings = getattr(base, "embeddings", None)
    table = getattr(embeddings, "position_embeddings", None)
    if not isinstance(table, torch.nn.Embedding):
        raise ModelError(
            f"{type(model).__name__}: share.positions needs a learned absolute position table "
            "(BERT, RoBERTa, ELECTRA, MiniLM, DistilBERT); this model has none"
        )
    if getattr(model.config, "position_embedding_type", "absolute") != "absolute":
        raise ModelError(
            f"{type(model).__name__}: share.positions only trims absolute position tables; this model "
            f"uses position_embedding_type {model.config.position_embedding_type!r}"
        )
    return embeddings


def position_offset(model: torch.nn.Module) -> int:
    """Rows before the first real position (RoBERTa counts positions from padding_idx + 1)."""
    padding_idx = getattr(_embeddings(model), "padding_idx", None)
    return 0 if padding_idx is None else int(padding_idx) + 1


@torch.no_grad()
def trim_positions(model: torch.nn.Module, tokenizer: Any, length: int) -> dict[str, int]:
    """Keep the rows for inputs of up to ``length`` tokens; returns the table sizes before and after."""
    embeddings = _embeddings(model)
    old: torch.nn.Embedding = embeddings.position_embeddings
    offset = position_offset(model)
    rows = length + offset
    if length <= 0 or rows > old.num_embeddings:
        raise RecipeError(
            f"share.positions: {length} must be between 1 and the model's "
            f"{old.num_embeddings - offset} positions"
        )
    new = torch.nn.Embedding(rows, old.embedding_dim, padding_idx=old.padding_idx, dtype=old.weight.dtype)
    new.weight.copy_(old.weight[:rows])
    new.weight.requires_grad_(old.weight.requires_grad)
    embeddings.position_embeddings = new
    for name in ("position_ids", "token_type_ids"):  # (1, max_positions) helper buffers
        buffer = getattr(embeddings, name, None)
        if isinstance(buffer, torch.Tensor) and buffer.dim() == 2:
            setattr(embeddings, name, buffer[:, :rows].clone())
    model.config.max_position_embeddings = rows
    if getattr(tokenizer, "model_max_length", None) is not None:
        tokenizer.model_max_length = min(int(tokenizer.model_max_length), length)
    return {"positions_before": old.num_embeddings - offset, "positions_after": length}
