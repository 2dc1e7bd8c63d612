"""Factorised embedding: SVD error is exactly the discarded singular values; the model keeps working."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compress.errors import RecipeError
from compress.models import load_classifier
from compress.share.factorize import FactorizedEmbedding, factorize_embedding, svd_factors
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
