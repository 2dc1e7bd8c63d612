"""Position-table trimming: the same outputs for inputs up to the kept length, fewer bytes, reloads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compress.errors import RecipeError
from compress.models import load_classifier
from compress.share.model import parameter_stats, save_shared_checkpoint
from compress.share.positions import trim_positions

TEXTS = ["a great film", "the plot was dull and the acting was worse"]


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def test_trimmed_bert_keeps_its_outputs_and_drops_the_rows(tiny_bert_dir: Path, tmp_path: Path):
    model, tokenizer = load_classifier(tiny_bert_dir)
    model.eval()
    batch = tokenizer(TEXTS, padding="max_length", truncation=True, max_length=12, return_tensors="pt")
    with torch.no_grad():
        before = model(**batch).logits
    params = parameter_stats(model)["parameters"]
    rows = model.config.max_position_embeddings

    sizes = trim_positions(model, tokenizer, 12)

    assert sizes == {"positions_before": rows, "positions_after": 12}
    hidden = model.config.hidden_size
    assert parameter_stats(model)["parameters"] == params - (rows - 12) * hidden
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, before)
    assert tokenizer.model_max_length == 12
    save_shared_checkpoint(model, tokenizer, tmp_path / "trimmed")
    loaded, _ = load_classifier(tmp_path / "trimmed")  # a plain Hugging Face checkpoint
    assert loaded.config.max_position_embeddings == 12
    assert loaded.get_input_embeddings().weight.shape[0] == model.get_input_embeddings().weight.shape[0]
    with torch.no_grad():
        assert torch.equal(loaded.eval()(**batch).logits, before)
    with pytest.raises((IndexError, RuntimeError)):  # 13 tokens no longer have a position
        _logits(loaded, torch.ones(1, 13, dtype=torch.long))


def test_roberta_tables_keep_their_padding_offset():
    from transformers import RobertaConfig, RobertaForSequenceClassification

    config = RobertaConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=40,
        pad_token_id=1,
    )
    torch.manual_seed(0)
    model = RobertaForSequenceClassification(config).eval()
    ids = torch.randint(3, 50, (2, 10))
    before = _logits(model, ids)
    trim_positions(model, None, 10)
    assert model.roberta.embeddings.position_embeddings.num_embeddings == 10 + 2  # rows 0-1: padding offset
    assert torch.equal(_logits(model, ids), before)


def test_more_positions_than_the_model_has_is_a_recipe_error(tiny_bert_dir: Path):
    model, tokenizer = load_classifier(tiny_bert_dir)
    with pytest.raises(RecipeError, match=r"share\.positions: 9999 must be between 1 and the model's"):
        trim_positions(model, tokenizer, 9999)
