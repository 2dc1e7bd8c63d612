"""Vocabulary pruning: the training text tokenises to the same tokens with remapped ids, rows follow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from compress.errors import RecipeError
from compress.models import load_classifier, save_checkpoint
from compress.share.vocab import (
    kept_token_ids,
    prune_tokenizer_json,
    prune_vocabulary,
    pruned_tokenizer,
    token_counts,
    used_token_ids,
)
from tests.helpers.tiny import review_rows

TRAIN = [text for text, _ in review_rows(40, seed=5)] + ["it's a zany, quirky film!"]


def _tokens(tokenizer, texts):
    return [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(texts)["input_ids"]]


def test_training_text_gives_same_tokens_with_remapped_ids_and_rows(tiny_bert_dir: Path):
    model, tokenizer = load_classifier(tiny_bert_dir)
    old_table = model.get_input_embeddings().weight.detach().clone()
    old_ids = tokenizer(TRAIN)["input_ids"]
    with torch.no_grad():
        reference = model(**tokenizer(TRAIN, padding=True, return_tensors="pt")).logits
    new_tok, sizes = prune_vocabulary(model, tokenizer, TRAIN, characters="none")
    assert sizes["vocab_after"] < sizes["vocab_before"]
    assert model.config.vocab_size == sizes["vocab_after"] == model.get_input_embeddings().num_embeddings
    assert _tokens(new_tok, TRAIN) == _tokens(tokenizer, TRAIN)
    new_of = new_tok.get_vocab()
    for old, new in zip(old_ids, new_tok(TRAIN)["input_ids"], strict=True):
        assert new == [new_of[t] for t in tokenizer.convert_ids_to_tokens(old)]
        assert torch.equal(model.get_input_embeddings().weight[new].detach(), old_table[old])
    with torch.no_grad():
        logits = model(**new_tok(TRAIN, padding=True, return_tensors="pt")).logits
    assert torch.allclose(logits, reference, atol=1e-5)
    assert new_tok.pad_token_id == model.config.pad_token_id


def test_token_counts_count_every_occurrence_of_texts_and_pairs(tiny_bert_dir: Path):
    _, tokenizer = load_classifier(tiny_bert_dir)
    counts = token_counts(tokenizer, ["the film the film", "film"], ["the end", "the"])
    the, film = tokenizer.convert_tokens_to_ids(["the", "film"])
    assert counts[the] == 4 and counts[film] == 3
    assert counts[tokenizer.cls_token_id] == 2 and counts[tokenizer.sep_token_id] == 4
    assert set(counts) == used_token_ids(tokenizer, ["the film the film", "film"], ["the end", "the"])


def test_pruned_checkpoint_reloads_with_its_tokenizer(tiny_bert_dir: Path, tmp_path: Path):
    model, tokenizer = load_classifier(tiny_bert_dir)
    new_tok, _ = prune_vocabulary(model, tokenizer, TRAIN)
    save_checkpoint(model, new_tok, tmp_path / "pruned")
    loaded, loaded_tok = load_classifier(tmp_path / "pruned")
    assert loaded_tok(TRAIN)["input_ids"] == new_tok(TRAIN)["input_ids"]
    saved = json.loads((tmp_path / "pruned" / "tokenizer.json").read_text())
    assert len(saved["model"]["vocab"]) == loaded.config.vocab_size


def test_characters_keep_unseen_words_out_of_unk(tiny_bert_dir: Path):
    model, tokenizer = load_classifier(tiny_bert_dir)
    with_chars, _ = prune_vocabulary(model, tokenizer, ["the film"], characters="all")
    assert "[UNK]" not in _tokens(with_chars, ["superb"])[0]
    model, tokenizer = load_classifier(tiny_bert_dir)
    without, _ = prune_vocabulary(model, tokenizer, ["the film"], characters="none")
    assert _tokens(without, ["superb"])[0] == ["[CLS]", "[UNK]", "[SEP]"]


def test_seen_characters_cover_new_words_in_the_training_alphabet_only(tiny_bert_dir: Path):
    model, tokenizer = load_classifier(tiny_bert_dir)
    seen, sizes = prune_vocabulary(model, tokenizer, ["the film"], characters="seen")
    assert "[UNK]" not in _tokens(seen, ["helm filth"])[0]  # new words, letters of "the film" only
    assert _tokens(seen, ["superb"])[0] == ["[CLS]", "[UNK]", "[SEP]"]  # s, u, p, r, b never seen
    model, tokenizer = load_classifier(tiny_bert_dir)
    _, every = prune_vocabulary(model, tokenizer, ["the film"], characters="all")
    assert sizes["vocab_after"] < every["vocab_after"]


def test_keep_list_and_reserve_add_tokens(tiny_bert_dir: Path):
    _, tokenizer = load_classifier(tiny_bert_dir)
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    used = set(tokenizer(["the film"])["input_ids"][0])
    base = kept_token_ids(data, used, characters="none")
    vocab = data["model"]["vocab"]
    assert vocab["superb"] in kept_token_ids(data, used, keep=["superb"], characters="none")
    assert set(range(12)) <= set(kept_token_ids(data, used, reserve=12, characters="none"))
    assert vocab["superb"] not in base
    with pytest.raises(RecipeError, match="'zzzz' is not in the tokenizer's vocabulary"):
        kept_token_ids(data, used, keep=["zzzz"])


def test_bpe_merge_chains_survive_pruning():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [text for text, _ in review_rows(200, seed=9)]
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<pad>", "<unk>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>")
    texts = corpus[:6]
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    kept = kept_token_ids(data, set().union(*tokenizer(texts)["input_ids"]), characters="none")
    new_data, remap = prune_tokenizer_json(data, kept)
    assert len(new_data["model"]["vocab"]) < len(data["model"]["vocab"])
    assert len(new_data["model"]["merges"]) < len(data["model"]["merges"])
    new_tok = pruned_tokenizer(tokenizer, new_data)
    assert _tokens(new_tok, texts) == _tokens(tokenizer, texts)
    assert new_tok(texts)["input_ids"] == [[remap[i] for i in ids] for ids in tokenizer(texts)["input_ids"]]
