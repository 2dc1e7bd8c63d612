"""Factorised embedding: SVD error is exactly the discarded singular values; the model keeps working."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compress.errors import RecipeError
from compress.models import load_classifier
from compress.share.factorize import (
    FactorizedEmbedding,
    factorize_embedding,
    frequency_weights,
    svd_factors,
)
from compress.share.model import (
    load_shared_classifier,
    parameter_stats,
    save_shared_checkpoint,
    set_sharing_spec,
)


def test_reconstruction_error_equals_discarded_singular_values():
    torch.manual_seed(0)
    weight = torch.randn(200, 24)
    singular = torch.linalg.svdvals(weight.double())
    for rank in (1, 5, 12, 23):
        factors = svd_factors(weight, rank)
        error = torch.linalg.norm(weight.double() - factors.table.double() @ factors.projection.double().T)
        assert error.item() == pytest.approx(torch.linalg.norm(singular[rank:]).item(), rel=1e-5)
        assert torch.allclose(factors.discarded.double(), singular[rank:], rtol=1e-5)


def _weighted_error(weight: torch.Tensor, factors, row_weights: torch.Tensor) -> float:
    rebuilt = factors.table.double() @ factors.projection.double().T
    return float(((weight.double() - rebuilt).pow(2).sum(dim=1) * row_weights.double()).sum().sqrt())


def test_weighted_factors_are_the_best_rank_e_fit_in_the_weighted_norm():
    torch.manual_seed(0)
    weight = torch.randn(200, 24)
    row_weights = torch.ones(200, dtype=torch.float64)
    row_weights[:10] = 1000.0  # ten frequent tokens
    scaled = weight.double() * row_weights.sqrt()[:, None]
    for rank in (10, 16):  # at least as many as the frequent rows
        weighted = svd_factors(weight, rank, row_weights)
        plain = svd_factors(weight, rank)
        error = _weighted_error(weight, weighted, row_weights)
        # the weighted error is exactly what the SVD of diag(sqrt(w)) E drops, and beats the plain fit there
        assert error == pytest.approx(torch.linalg.norm(torch.linalg.svdvals(scaled)[rank:]).item(), rel=1e-5)
        assert error < 0.9 * _weighted_error(weight, plain, row_weights)
        # the frequent rows come out closer than the plain SVD puts them
        rebuilt = (weighted.table.double() @ weighted.projection.double().T)[:10]
        rebuilt_plain = (plain.table.double() @ plain.projection.double().T)[:10]
        top = weight.double()[:10]
        assert torch.linalg.norm(rebuilt - top) < 0.5 * torch.linalg.norm(rebuilt_plain - top)
    # equal weights are the plain SVD
    equal, plain = svd_factors(weight, 5, torch.full((200,), 7.0)), svd_factors(weight, 5)
    assert torch.allclose(equal.table @ equal.projection.T, plain.table @ plain.projection.T, atol=1e-4)


@pytest.mark.parametrize("bad", [torch.ones(199), torch.zeros(200), -torch.ones(200)])
def test_row_weights_must_be_one_positive_number_per_row(bad: torch.Tensor):
    with pytest.raises(ValueError, match="200 positive numbers"):
        svd_factors(torch.randn(200, 24), 4, bad)


def test_frequency_weights_are_counts_plus_one():
    weights = frequency_weights({0: 5, 3: 1, 99: 4}, 4)
    assert weights.tolist() == [6.0, 1.0, 1.0, 2.0]


def test_factorised_model_replaces_the_table_and_saves_parameters(tiny_bert_dir: Path, tmp_path: Path):
    model, tokenizer = load_classifier(tiny_bert_dir)
    table = model.get_input_embeddings().weight.detach().clone()
    vocab, hidden = table.shape
    before = parameter_stats(model)["parameters"]
    report = factorize_embedding(model, 8)
    set_sharing_spec(model, embedding_rank=8)
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, FactorizedEmbedding)
    assert parameter_stats(model)["parameters"] == before - vocab * hidden + vocab * 8 + 8 * hidden
    expected = torch.linalg.norm(torch.linalg.svdvals(table.double())[8:]) / torch.linalg.norm(table.double())
    assert report["relative_error"] == pytest.approx(expected.item(), rel=1e-5)
    save_shared_checkpoint(model, tokenizer, tmp_path / "fact")
    loaded, _ = load_shared_classifier(tmp_path / "fact")
    assert torch.equal(loaded.get_input_embeddings().dense_weight(), embedding.dense_weight())
    batch = tokenizer(["the film was great"], return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(model.eval()(**batch).logits, loaded(**batch).logits, atol=1e-6)


def test_factorising_twice_is_a_config_error(tiny_bert_dir: Path):
    model, _ = load_classifier(tiny_bert_dir)
    factorize_embedding(model, 8)
    with pytest.raises(RecipeError, match="factorise a model only once"):
        factorize_embedding(model, 4)


@pytest.mark.parametrize("rank", [32, 64, 0])
def test_rank_not_below_hidden_size_is_a_config_error(tiny_bert_dir: Path, rank: int):
    model, _ = load_classifier(tiny_bert_dir)
    with pytest.raises(RecipeError, match="hidden size 32"):
        factorize_embedding(model, rank)
