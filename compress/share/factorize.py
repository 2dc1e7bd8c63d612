"""Factorised word embedding (ALBERT): a V×H table becomes a V×E table and an E×H projection.

The factors come from a truncated SVD of the trained table, so the product is the best rank-E
approximation of it (Eckart–Young): the Frobenius error is exactly the norm of the singular
values that were dropped, and the model starts recovery close to where it was.

Given how often each token occurs in the task's text, the SVD is weighted by it: the factors minimise
sum_v w_v ||e_v - ê_v||² (the SVD of diag(√w)·E, unscaled afterwards), so the rank is spent on the rows
the model reads most ([CLS], [SEP], function words) instead of spread evenly over thousands of rare
pieces. Occurrence counts are the cheapest stand-in for the Fisher weights of weighted low-rank
factorisation (Hsu et al., 2022): an embedding row only gets a gradient when its token occurs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from compress.errors import RecipeError


class FactorizedEmbedding(torch.nn.Module):
    """Token id -> E-dim row -> H-dim vector; a drop-in for ``nn.Embedding`` in the encoder."""

    def __init__(self, num_embeddings: int, rank: int, hidden_size: int, padding_idx: int | None = None):
        super().__init__()
        self.embed = torch.nn.Embedding(num_embeddings, rank, padding_idx=padding_idx)
        self.project = torch.nn.Linear(rank, hidden_size, bias=False)

    @property
    def num_embeddings(self) -> int:
        return self.embed.num_embeddings

    @property
    def embedding_dim(self) -> int:
        return self.project.out_features

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.project(self.embed(input_ids))

    def dense_weight(self) -> torch.Tensor:
        """The V×H table this factorisation stands for."""
        return self.embed.weight @ self.project.weight.T


@dataclass(frozen=True)
class Factors:
    table: torch.Tensor
    """V×E: the left singular vectors scaled by the kept singular values (and unweighted)."""
    projection: torch.Tensor
    """H×E: ``nn.Linear(E, H).weight`` layout, the kept right singular vectors."""
    discarded: torch.Tensor
    """Singular values that the rank-E approximation drops (of the weighted table, if weighted)."""


def check_rank(rank: int, hidden_size: int) -> None:
    if not 0 < rank < hidden_size:
        raise RecipeError(
            f"share.embedding_rank: {rank} must be between 1 and the hidden size {hidden_size} "
            f"(exclusive) to save parameters; e.g. embedding_rank: {max(1, hidden_size // 3)}"
        )


@torch.no_grad()
def truncated_svd(
    matrix: torch.Tensor, rank: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U_r, S_r, Vh_r, discarded singular values) of ``matrix``, computed in float64 for a faithful error."""
    u, s, vh = torch.linalg.svd(matrix.detach().double(), full_matrices=False)
    return u[:, :rank], s[:rank], vh[:rank], s[rank:]


@torch.no_grad()
def svd_factors(weight: torch.Tensor, rank: int, row_weights: torch.Tensor | None = None) -> Factors:
    """Best rank-``rank`` factors of a V×H embedding table, in the row-weighted norm if ``row_weights``."""
    check_rank(rank, weight.shape[1])
    if row_weights is None:
        u, s, vh, discarded = truncated_svd(weight, rank)
        table = u * s
    else:
        if row_weights.shape != (weight.shape[0],) or not bool((row_weights > 0).all()):
            raise ValueError(f"row_weights must be {weight.shape[0]} positive numbers, one per row")
        scale = row_weights.double().sqrt()[:, None]
        u, s, vh, discarded = truncated_svd(weight.double() * scale, rank)
        table = u * s / scale
    projection = vh.T.contiguous().to(weight.dtype)
    return Factors(table.to(weight.dtype), projection, discarded.to(weight.dtype))


def frequency_weights(counts: dict[int, int], vocab_size: int) -> torch.Tensor:
    """One weight per row: the token's occurrences plus one (a kept token the text never uses counts too)."""
    weights = torch.ones(vocab_size, dtype=torch.float64)
    for token, count in counts.items():
        if 0 <= token < vocab_size:
            weights[token] += count
    return weights


def factorize_embedding(
    model: torch.nn.Module, rank: int, row_weights: torch.Tensor | None = None
) -> dict[str, float]:
    """Replace the model's word embedding by its rank-``rank`` SVD factorisation, in place.

    Returns the relative Frobenius error of the reconstructed table and the share of the
    table's energy that was kept, both in the norm the factors minimise (row-weighted if
    ``row_weights``), and, when weighted, also the plain relative error of the table.
    """
    old = model.get_input_embeddings()
    if not isinstance(old, torch.nn.Embedding):
        raise RecipeError(
            f"share.embedding_rank: the word embedding is already a {type(old).__name__}; "
            "factorise a model only once"
        )
    factors = svd_factors(old.weight, rank, row_weights)
    new = FactorizedEmbedding(old.num_embeddings, rank, old.embedding_dim, old.padding_idx)
    with torch.no_grad():
        new.embed.weight.copy_(factors.table)
        new.project.weight.copy_(factors.projection)
    model.set_input_embeddings(new)
    table = old.weight.detach().double()
    rows = table.pow(2).sum(dim=1)
    total = float(rows.sum() if row_weights is None else (rows * row_weights.double()).sum())
    dropped = float(factors.discarded.double().pow(2).sum())
    quality = {
        "relative_error": (dropped / total) ** 0.5 if total else 0.0,
        "energy_kept": 1 - dropped / total if total else 1.0,
    }
    if row_weights is not None:
        plain = (new.dense_weight().detach().double() - table).norm() / table.norm()
        quality["unweighted_relative_error"] = float(plain)
    return quality


def install_factorized(model: torch.nn.Module, rank: int) -> None:
    """Give a freshly built model the factorised embedding structure (weights are loaded afterwards)."""
    old = model.get_input_embeddings()
    model.set_input_embeddings(
        FactorizedEmbedding(old.num_embeddings, rank, old.embedding_dim, old.padding_idx)
    )
