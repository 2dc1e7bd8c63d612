"""ELECTRA's replaced-token detection as a distillation term, on tiny models."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from compress.distill.augment import word_tokens
from compress.distill.config import DistillOptions, RtdOptions
from compress.distill.objective import DistillModule
from compress.distill.rtd import IGNORE, Replacer, rtd_loss, word_embeddings
from compress.errors import RecipeError
from compress.models import load_classifier
from compress.stages import get_stage
from tests.helpers.stages import stage_context
from tests.helpers.tiny import vocab_words, write_recipe


def encode(tokenizer, texts):
    return tokenizer(list(texts), padding=True, return_tensors="pt")


def test_rtd_loss_matches_a_hand_value_and_skips_unlabelled_tokens():
    logits = torch.tensor([[0.0, 2.0, 5.0]])
    labels = torch.tensor([[1, 0, IGNORE]])
    expected = (math.log(2) + math.log(1 + math.e**2)) / 2
    assert rtd_loss(logits, labels).item() == pytest.approx(expected, rel=1e-6)
    nothing = torch.full((1, 3), IGNORE)
    assert rtd_loss(logits.requires_grad_(), nothing).item() == 0.0


def test_replacer_swaps_only_real_word_tokens_for_neighbours_and_labels_every_real_token(tiny_bert_dir):
    model, tokenizer = load_classifier(tiny_bert_dir)
    enc = encode(tokenizer, ["the film was really good , ! zq", "bad meal"])  # zq: z ##q
    table = word_embeddings(model)
    replacer = Replacer(tokenizer, table, RtdOptions(rate=0.5, candidates=3), seed=0, seen=enc["input_ids"])
    words = set(word_tokens(tokenizer).tolist())  # whole alphabetic tokens: the words and the letters
    assert {tokenizer.convert_tokens_to_ids(w) for w in vocab_words()} <= words
    special = set(tokenizer.all_special_ids)
    swapped = 0
    for _ in range(20):
        corrupted, labels = replacer(enc["input_ids"], enc["attention_mask"])
        real = enc["attention_mask"].bool()
        changed = corrupted != enc["input_ids"]
        # labels: 1 exactly where a token changed; -100 on padding and [CLS]/[SEP]; 0 on other real tokens
        assert torch.equal(labels == 1, changed)
        assert (
            (labels == IGNORE) == (~real | torch.isin(enc["input_ids"], torch.tensor(sorted(special))))
        ).all()
        for original, new in zip(
            enc["input_ids"][changed].tolist(), corrupted[changed].tolist(), strict=True
        ):
            assert original in words and new in words and new in replacer.table[original].tolist()
        punctuation = torch.isin(enc["input_ids"], torch.tensor(tokenizer.convert_tokens_to_ids([",", "!"])))
        assert not changed[punctuation].any()
        pieces = torch.tensor(
            [t.startswith("##") for t in tokenizer.convert_ids_to_tokens(enc["input_ids"][0])]
        )
        assert pieces.any() and not changed[0][pieces].any()  # a word's continuation pieces are never swapped
        swapped += int(changed.sum())
    assert swapped > 0
    # the neighbours are the nearest by cosine in the embedding table
    unit = torch.nn.functional.normalize(table, dim=-1)
    good = tokenizer.convert_tokens_to_ids("good")
    sims = unit[good] @ unit.T
    assert sims[replacer.table[good]].min() >= max(
        sims[w] for w in words if w != good and w not in replacer.table[good].tolist()
    )


def test_replacer_draws_are_seeded(tiny_bert_dir):
    model, tokenizer = load_classifier(tiny_bert_dir)
    enc = encode(tokenizer, ["the film was really good", "bad meal and rude staff"])

    def draws(seed):
        r = Replacer(tokenizer, word_embeddings(model), RtdOptions(), seed=seed, seen=enc["input_ids"])
        return [r(enc["input_ids"], enc["attention_mask"])[0] for _ in range(5)]

    assert all(torch.equal(a, b) for a, b in zip(draws(1), draws(1), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(draws(1), draws(2), strict=True))


def test_replacer_refuses_a_vocabulary_with_too_few_words(tiny_bert_dir):
    model, tokenizer = load_classifier(tiny_bert_dir)
    enc = encode(tokenizer, ["good"])
    with pytest.raises(
        RecipeError, match=r"^rtd: the vocabulary has \d+ whole-word tokens.*lower rtd\.candidates"
    ):
        Replacer(tokenizer, word_embeddings(model), RtdOptions(candidates=500), seed=0, seen=enc["input_ids"])


def test_replacer_refuses_a_transfer_set_without_words(tiny_bert_dir):
    model, tokenizer = load_classifier(tiny_bert_dir)
    enc = encode(tokenizer, [", !"])
    with pytest.raises(RecipeError, match=r"^rtd: the transfer set has no token .*set weights\.rtd: 0$"):
        Replacer(tokenizer, word_embeddings(model), RtdOptions(), seed=0, seen=enc["input_ids"])


def test_a_recovery_error_names_the_stage_and_key(tmp_path, tiny_bert_dir, reviews):
    stages = (
        "  - type: share\n    layers: {mode: all, relax_rank: 4}\n"
        "    recovery: {epochs: 1, batch_size: 16, weights: {soft: 1, rtd: 1}, rtd: {candidates: 500}}\n"
    )
    recipe = write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=stages)
    ctx = stage_context(recipe, tmp_path / "run", tiny_bert_dir)
    with pytest.raises(
        RecipeError, match=r"stages\[0\]\.recovery\.rtd: the vocabulary has \d+ whole-word"
    ) as err:
        get_stage("share").run(ctx)
    assert "\n" not in str(err.value)


def test_a_factorised_table_gives_its_dense_product(tiny_bert_dir):
    from compress.share.factorize import FactorizedEmbedding

    model, _ = load_classifier(tiny_bert_dir)
    table = model.get_input_embeddings()
    small = FactorizedEmbedding(table.num_embeddings, 4, table.embedding_dim)
    model.set_input_embeddings(small)
    assert torch.allclose(word_embeddings(model), small.embed.weight @ small.project.weight.T)


def test_the_term_trains_the_encoder_and_its_head_but_not_the_classifier(tiny_bert_dir):
    model, tokenizer = load_classifier(tiny_bert_dir)
    options = DistillOptions(weights={"soft": 0, "rtd": 1})
    module = DistillModule(model, options, [], model.config.hidden_size)
    enc = encode(tokenizer, ["the film was really good", "bad meal"])
    batch = {**enc, "labels": torch.tensor([1, 0]), "index": torch.arange(2)}
    replacer = Replacer(
        tokenizer, word_embeddings(model), RtdOptions(rate=0.5), seed=0, seen=enc["input_ids"]
    )
    terms = module(
        batch, {"logits": torch.zeros(2, 2)}, None, replacer(enc["input_ids"], enc["attention_mask"])
    )
    assert set(terms) == {"rtd", "total"} and terms["rtd"].item() > 0
    terms["total"].backward()
    assert model.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    assert module.detector.dense_prediction.weight.grad.abs().sum() > 0
    assert model.classifier.weight.grad is None
    # without a replaced batch (a phase that does not train it) the term is not computed
    assert "rtd" not in module(batch, {"logits": torch.zeros(2, 2)}, None)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rtd": {"rate": 0}}, "greater than 0"),
        ({"rtd": {"rate": 1}}, "less than 1"),
        ({"rtd": {"candidates": 0}}, "greater than or equal to 1"),
        ({"weights": {"soft": 0, "rtd": -1}}, "greater than or equal to 0"),
    ],
)
def test_bad_options_are_refused_at_the_door(options, message):
    with pytest.raises(ValidationError, match=message):
        DistillOptions.model_validate(options)


def test_distill_stage_runs_with_replaced_token_detection_and_saves_no_head(tmp_path, tiny_bert_dir, reviews):
    from safetensors import safe_open

    stages = (
        "  - type: distill\n    layers: 1\n    batch_size: 16\n    lr: 3.0e-3\n    epochs: 2\n"
        "    patience: null\n    weights: {soft: 1, rtd: 1}\n    rtd: {rate: 0.3, candidates: 4}\n"
    )
    recipe = write_recipe(tmp_path / "r.yaml", teacher=tiny_bert_dir, data=reviews, stages=stages)
    ctx = stage_context(recipe, tmp_path / "run", tiny_bert_dir)
    result = get_stage("distill").run(ctx)
    curves = result.metrics["loss_curves"]
    assert set(curves) == {"soft", "rtd", "total"} and len(curves["rtd"]) == 2
    assert curves["rtd"][1] < curves["rtd"][0]  # the detector learns something in two epochs
    assert curves["total"][0] == pytest.approx(curves["soft"][0] + curves["rtd"][0], abs=1e-5)
    with safe_open(str(ctx.out_dir / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert names and not any("detector" in k or "dense_prediction" in k for k in names)
