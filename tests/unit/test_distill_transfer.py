"""Teacher-output cache and TinyBERT-style augmentation on the tiny model."""

from __future__ import annotations

import json
import string

import pytest
import torch

from compress.data import Split
from compress.distill.augment import augment_split, slots, word_tokens
from compress.distill.config import AugmentOptions
from compress.distill.transfer import combine, teacher_outputs
from compress.errors import DataError
from compress.models import load_classifier
from compress.training import encode, forward_inputs
from tests.helpers.tiny import NEGATIVE, POSITIVE, vocab_words

TEXTS = ["the film was really good", "bad", "it is a very slow and rude hotel !", "a tasty meal"]


def split(texts=TEXTS, labels=(1, 0, 0, 1)) -> Split:
    return Split(list(texts), None, list(labels), ["negative", "positive"], "mem", "sha-" + str(len(texts)))


class Refuses(torch.nn.Module):
    def forward(self, **kwargs):
        raise AssertionError("the teacher ran although its outputs are cached")


def test_teacher_outputs_are_cached_and_unpack_to_the_teachers_states(tmp_path, tiny_bert_dir):
    teacher, tokenizer = load_classifier(tiny_bert_dir)
    data = encode(tokenizer, split(), 32)
    kw = {
        "cache_dir": tmp_path,
        "teacher_sha": "t",
        "data_sha": "d",
        "max_length": 32,
        "hidden_layers": [0, 2],
        "attention_layers": [2],
    }
    first = teacher_outputs(teacher, data, **kw)
    files = list((tmp_path / "distill").glob("teacher-*.safetensors"))
    assert len(files) == 1
    again = teacher_outputs(Refuses(), data, **kw)
    assert torch.equal(first.logits, again.logits)
    with torch.no_grad():
        ref = teacher(
            **forward_inputs(
                teacher,
                {
                    k: data.input_ids if k == "input_ids" else getattr(data, k)
                    for k in ("input_ids", "attention_mask", "token_type_ids")
                },
            ),
            output_hidden_states=True,
            output_attentions=True,
        )
    length = int(data.attention_mask.sum(1).max())
    got = again.batch(torch.tensor([1, 2]), length)
    real = data.attention_mask[[1, 2], :length].bool()
    for layer in (0, 2):
        expected = ref.hidden_states[layer][[1, 2], :length]
        assert torch.allclose(got["hidden"][layer][real], expected[real], atol=2e-2)
        assert (got["hidden"][layer][~real] == 0).all()
    pairs = real[:, None, :, None] & real[:, None, None, :]
    expected = ref.attentions[1][[1, 2], :, :length, :length]
    assert torch.allclose(
        got["attentions"][2][pairs.expand_as(expected)], expected[pairs.expand_as(expected)], atol=1e-3
    )
    logits_only = again.batch(torch.tensor([1, 2]), length, layers=False)
    assert logits_only["hidden"] == {} and logits_only["attentions"] == {}
    assert torch.equal(logits_only["logits"], got["logits"])
    other = teacher_outputs(teacher, data, **{**kw, "max_length": 16})
    assert torch.equal(other.logits, first.logits)
    assert len(list((tmp_path / "distill").glob("teacher-*.safetensors"))) == 2


def test_combine_marks_unlabelled_rows():
    merged = combine([split(), Split(["new text"], None, None, ["negative", "positive"], "u", "u")])
    assert merged.labels == [1, 0, 0, 1, -100]


def test_embedding_augmentation_swaps_single_token_words_for_word_neighbours(tmp_path, tiny_bert_dir):
    teacher, tokenizer = load_classifier(tiny_bert_dir)
    words = set(vocab_words()) | set(string.ascii_lowercase)
    assert {tokenizer.convert_ids_to_tokens(i) for i in word_tokens(tokenizer).tolist()} == words
    options = AugmentOptions(multiplier=3, candidates=4, replace_prob=1.0)
    rows = augment_split(split(), tokenizer, teacher, options, seed=0, cache_dir=tmp_path, teacher_sha="t")
    assert len(rows) == 3 * len(TEXTS) and rows.labels is None
    for i, text in enumerate(TEXTS):
        for new in rows.texts[3 * i : 3 * i + 3]:
            old_words, new_words = text.split(), new.split()
            assert len(old_words) == len(new_words)
            for old, word in zip(old_words, new_words, strict=True):
                assert word == old or (old in words and word in words)
    assert rows.texts[0] != TEXTS[0]
    cached = list((tmp_path / "distill").glob("augment-*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["texts"] == rows.texts


def test_mlm_augmentation_uses_the_masked_lm_in_context(tmp_path, tiny_bert_dir):
    from transformers import BertConfig, BertForMaskedLM

    teacher, tokenizer = load_classifier(tiny_bert_dir)
    torch.manual_seed(0)
    mlm = BertForMaskedLM(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
        )
    )
    good = tokenizer.convert_tokens_to_ids("good")
    with torch.no_grad():
        mlm.cls.predictions.bias.zero_()
        mlm.cls.predictions.bias[good] = 100.0  # this MLM always guesses "good"
    mlm.save_pretrained(tmp_path / "mlm", safe_serialization=True)
    options = AugmentOptions(
        multiplier=2, method="mlm", mlm_model=str(tmp_path / "mlm"), candidates=1, replace_prob=1.0
    )
    rows = augment_split(
        split(["bad", "a tasty meal"], [0, 1]),
        tokenizer,
        teacher,
        options,
        seed=0,
        cache_dir=tmp_path,
        teacher_sha="t",
    )
    assert rows.texts == ["good", "good", "good good good", "good good good"]


@pytest.mark.parametrize("text", ["bad", "a tasty meal"])
def test_slots_are_character_spans_of_one_token_words(tiny_bert_dir, text):
    _, tokenizer = load_classifier(tiny_bert_dir)
    spans = slots(tokenizer, text, set(word_tokens(tokenizer).tolist()))
    assert [text[s:e] for s, e, _ in spans] == text.split()
    assert all(w in POSITIVE + NEGATIVE + vocab_words() for w in text.split())


def test_fitted_mlm_proposer_learns_the_texts_and_leaves_the_teacher_and_rng_alone(tmp_path, tiny_bert_dir):
    from compress.distill.augment import load_mlm
    from compress.distill.config import ProposerOptions
    from compress.distill.proposer import REPORT, fit_proposer

    teacher, tokenizer = load_classifier(tiny_bert_dir)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    texts = [f"the {w} film was {v}" for w in ("long", "short", "new") for v in POSITIVE + NEGATIVE] * 8
    options = ProposerOptions(epochs=6, lr=1e-2, train_layers=1, holdout=0.1)
    torch.manual_seed(123)
    rng_before = torch.get_rng_state()
    report = fit_proposer(teacher, tokenizer, texts, options, 0, tmp_path / "proposer")
    assert torch.equal(torch.get_rng_state(), rng_before)  # a cached run draws the same stream after it
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in before.items())
    assert report["fit_texts"] + report["heldout_texts"] == len(texts) and report["heldout_masked_tokens"] > 0
    # chance over the vocabulary is < 2%; "the" and "film"/"was" are predictable from position alone
    assert report["heldout_top1"] > 0.2, report
    assert json.loads((tmp_path / "proposer" / REPORT).read_text())["heldout_top1"] == report["heldout_top1"]
    mlm = load_mlm(tmp_path / "proposer")
    assert mlm.get_output_embeddings().weight.data_ptr() == mlm.get_input_embeddings().weight.data_ptr()
    torch.testing.assert_close(mlm.get_input_embeddings().weight, teacher.get_input_embeddings().weight)


def test_mlm_augmentation_without_a_model_fits_a_proposer_once(tmp_path, tiny_bert_dir):
    teacher, tokenizer = load_classifier(tiny_bert_dir)
    options = AugmentOptions(
        multiplier=2, method="mlm", candidates=3, replace_prob=1.0, proposer={"epochs": 1, "holdout": 0.25}
    )
    rows = augment_split(split(), tokenizer, teacher, options, seed=0, cache_dir=tmp_path, teacher_sha="t")
    assert len(rows.texts) == 2 * len(TEXTS)
    proposers = list((tmp_path / "distill").glob("proposer-*"))
    assert len(proposers) == 1 and (proposers[0] / "model.safetensors").is_file()
    vocab = set(tokenizer.get_vocab())
    changed = [v for v, t in zip(rows.texts, [t for t in TEXTS for _ in range(2)], strict=True) if v != t]
    assert changed and all(w in vocab for v in changed for w in v.split() if w.isalpha())


PAIRS = ["a tasty meal", "the film was really good", "bad", "it is slow"]


def pair_split() -> Split:
    return Split(list(TEXTS), list(PAIRS), [1, 0, 0, 1], ["no", "yes"], "mem", "sha-pairs")


def test_swap_pairs_alone_adds_every_pair_second_text_first(tmp_path, tiny_bert_dir):
    teacher, tokenizer = load_classifier(tiny_bert_dir)
    options = AugmentOptions(multiplier=0, swap_pairs=True)
    rows = augment_split(
        pair_split(), tokenizer, teacher, options, seed=0, cache_dir=tmp_path, teacher_sha="t"
    )
    assert rows.texts == PAIRS and rows.pairs == TEXTS and rows.labels is None


def test_swap_pairs_with_variants_swaps_the_originals_and_every_variant(tmp_path, tiny_bert_dir):
    teacher, tokenizer = load_classifier(tiny_bert_dir)
    plain = augment_split(
        pair_split(),
        tokenizer,
        teacher,
        AugmentOptions(multiplier=2, replace_prob=1.0),
        seed=0,
        cache_dir=tmp_path / "plain",
        teacher_sha="t",
    )
    options = AugmentOptions(multiplier=2, replace_prob=1.0, swap_pairs=True)
    rows = augment_split(
        pair_split(), tokenizer, teacher, options, seed=0, cache_dir=tmp_path, teacher_sha="t"
    )
    n = len(TEXTS)
    assert len(rows) == 2 * 2 * n + n
    assert rows.texts[: 2 * n] == plain.texts and rows.pairs[: 2 * n] == plain.pairs
    ordered = set(zip(TEXTS + plain.texts, PAIRS + plain.pairs, strict=True))
    swapped = set(zip(rows.pairs[2 * n :], rows.texts[2 * n :], strict=True))
    assert swapped == ordered


def test_swap_pairs_needs_a_pair_task_and_rows_to_add(tmp_path, tiny_bert_dir):
    from pydantic import ValidationError

    from compress.errors import DataError

    teacher, tokenizer = load_classifier(tiny_bert_dir)
    with pytest.raises(DataError, match="swap_pairs: the task has no second text"):
        augment_split(
            split(),
            tokenizer,
            teacher,
            AugmentOptions(multiplier=0, swap_pairs=True),
            seed=0,
            cache_dir=tmp_path,
            teacher_sha="t",
        )
    with pytest.raises(ValidationError, match="augment adds no rows with multiplier: 0"):
        AugmentOptions(multiplier=0)


def test_span_augmentation_cuts_contiguous_phrases_of_each_text(tmp_path, tiny_bert_dir):
    """``method: spans``: every variant is a run of two or more consecutive words of its own text,
    shorter than the text; texts under three words come back as they are; same seed, same spans."""
    teacher, tokenizer = load_classifier(tiny_bert_dir)
    options = AugmentOptions(method="spans", multiplier=5)
    rows = augment_split(split(), tokenizer, teacher, options, seed=0, cache_dir=tmp_path, teacher_sha="t")
    assert len(rows) == 5 * len(TEXTS) and rows.labels is None and rows.pairs is None
    for i, text in enumerate(TEXTS):
        words = text.split()
        for new in rows.texts[5 * i : 5 * i + 5]:
            if len(words) < 3:
                assert new == text
                continue
            cut = new.split()
            assert 2 <= len(cut) < len(words)
            assert any(words[s : s + len(cut)] == cut for s in range(len(words) - len(cut) + 1))
    long = rows.texts[10:15]  # "it is a very slow and rude hotel !": 9 words, so the spans differ
    assert len(set(long)) > 1
    again = augment_split(
        split(), tokenizer, teacher, options, seed=0, cache_dir=tmp_path / "b", teacher_sha="t"
    )
    assert again.texts == rows.texts
    other = augment_split(
        split(), tokenizer, teacher, options, seed=1, cache_dir=tmp_path / "c", teacher_sha="t"
    )
    assert other.texts != rows.texts


NEWS = [
    "stocks fell sharply on friday",
    "the dog barked at night",
    "rain is expected tomorrow",
    "shares fell sharply friday",
]
NEWS_PAIRS = [
    "the dog barked loudly at night",
    "heavy rain expected tomorrow in the north",
    "shares fell sharply friday",
    "markets closed early",
]


def test_pair_augmentation_matches_each_first_text_with_the_second_texts_sharing_its_words(
    tmp_path, tiny_bert_dir
):
    """``method: pairs``: the new second text is the other row's that shares most words with the first
    text; a row's own second text and a copy of the first text itself are never chosen."""
    teacher, tokenizer = load_classifier(tiny_bert_dir)
    data = Split(list(NEWS), list(NEWS_PAIRS), [0, 1, 0, 1], ["no", "yes"], "mem", "sha-news")

    def pairs(rows: Split, multiplier: int) -> Split:
        options = AugmentOptions(method="pairs", multiplier=multiplier)
        return augment_split(rows, tokenizer, teacher, options, seed=0, cache_dir=tmp_path, teacher_sha="t")

    one = pairs(data, 1)
    assert one.labels is None and one.texts == NEWS
    # Row 3's nearest second text is a copy of itself ("shares fell sharply friday"), so it takes the
    # next best; rows 1 and 2 share no word with it, and ties go to the earlier row.
    assert one.pairs == [NEWS_PAIRS[2], NEWS_PAIRS[0], NEWS_PAIRS[1], NEWS_PAIRS[0]]
    every = pairs(data, 5)
    made = list(zip(every.texts, every.pairs, strict=True))
    allowed = {(a, b) for i, a in enumerate(NEWS) for j, b in enumerate(NEWS_PAIRS) if j != i and b != a}
    assert set(made) == allowed and len(made) == len(allowed)  # capped by what is there, no repeats
    with pytest.raises(DataError, match="method: pairs needs a pair task"):
        pairs(split(), 2)


def test_teacher_outputs_run_longest_rows_first_and_come_back_in_row_order(tmp_path, tiny_bert_dir):
    """Batches of rows of one length (less padding computed); every output lands on its own row."""
    teacher, tokenizer = load_classifier(tiny_bert_dir)
    data = encode(tokenizer, split(), 32)
    seen: list[int] = []
    real_forward = teacher.forward

    def forward(**kwargs):
        seen.append(int(kwargs["input_ids"].shape[1]))
        return real_forward(**kwargs)

    teacher.forward = forward
    kw = {"cache_dir": tmp_path, "teacher_sha": "t", "data_sha": "d", "max_length": 32}
    got = teacher_outputs(teacher, data, **kw, hidden_layers=[2], batch_size=2)
    lengths = data.attention_mask.sum(1).sort(descending=True).values.tolist()
    assert seen == [lengths[0], lengths[2]]  # two batches, each trimmed to its own longest row
    with torch.no_grad():
        for row in range(len(TEXTS)):
            n = int(data.attention_mask[row].sum())
            one = {
                k: getattr(data, k)[row : row + 1, :n]
                for k in ("input_ids", "attention_mask", "token_type_ids")
            }
            ref = real_forward(**one, output_hidden_states=True)
            assert torch.allclose(got.logits[row], ref.logits[0], atol=1e-5)
            mine = got.batch(torch.tensor([row]), n)["hidden"][2][0]
            assert torch.allclose(mine, ref.hidden_states[2][0], atol=2e-2)
