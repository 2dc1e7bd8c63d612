"""Each loss term against a value computed by hand on tiny tensors."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from compress.distill.config import DistillOptions, LossWeights, MlmOptions
from compress.distill.losses import Masker, attention_mse, hard_ce, hidden_alignment, mlm_loss, soft_kl


def test_soft_kl_matches_hand_value_and_scales_with_t_squared():
    # teacher softmax = [0.75, 0.25], student = [0.5, 0.5]
    kl = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    student = torch.zeros(1, 2)
    assert soft_kl(student, torch.tensor([[math.log(3), 0.0]]), 1.0).item() == pytest.approx(kl, rel=1e-5)
    # at T=2 the teacher logits are halved first, so doubling them gives the same distributions
    assert soft_kl(student, torch.tensor([[2 * math.log(3), 0.0]]), 2.0).item() == pytest.approx(
        4 * kl, rel=1e-5
    )


def test_soft_kl_is_zero_when_student_equals_teacher():
    logits = torch.tensor([[1.0, -2.0, 0.5]])
    assert soft_kl(logits, logits, 3.0).item() == pytest.approx(0.0, abs=1e-6)


def test_hard_ce_skips_unlabelled_rows():
    logits = torch.tensor([[0.0, math.log(3)], [5.0, -5.0]])
    labels = torch.tensor([1, -100])
    assert hard_ce(logits, labels).item() == pytest.approx(-math.log(0.75), rel=1e-5)
    assert hard_ce(logits, torch.tensor([-100, -100])).item() == 0.0


def test_hidden_cosine_and_mse_ignore_padding():
    student = {1: torch.tensor([[[1.0, 0.0], [9.0, 9.0]]])}
    teacher = {2: torch.tensor([[[1.0, 1.0], [-9.0, 0.0]]])}
    mask = torch.tensor([[1, 0]])
    cosine = hidden_alignment(student, teacher, [(1, 2)], mask, "cosine")
    assert cosine.item() == pytest.approx(1 - 1 / math.sqrt(2), rel=1e-5)
    assert hidden_alignment(student, teacher, [(1, 2)], mask, "mse").item() == pytest.approx(0.5)


def test_hidden_mse_through_projection_to_a_wider_teacher():
    projection = torch.nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        projection.weight.copy_(torch.tensor([[2.0], [0.0]]))
    student = {1: torch.tensor([[[1.0]]])}
    teacher = {1: torch.tensor([[[1.0, 1.0]]])}
    # projected student = [2, 0]; squared errors 1 and 1 -> mean 1
    loss = hidden_alignment(student, teacher, [(1, 1)], torch.ones(1, 1), "mse", projection)
    assert loss.item() == pytest.approx(1.0)


def test_hidden_loss_averages_over_mapped_pairs():
    student = {0: torch.ones(1, 1, 2), 1: torch.ones(1, 1, 2)}
    teacher = {0: torch.ones(1, 1, 2), 3: torch.zeros(1, 1, 2)}
    loss = hidden_alignment(student, teacher, [(0, 0), (1, 3)], torch.ones(1, 1), "mse")
    assert loss.item() == pytest.approx(0.5)


def test_attention_mse_counts_real_query_key_pairs_only():
    student = {1: torch.tensor([[[[0.5, 0.5], [0.0, 1.0]]]])}
    teacher = {2: torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]]])}
    assert attention_mse(student, teacher, [(1, 2)], torch.tensor([[1, 0]])).item() == pytest.approx(0.25)
    # all four pairs: (0.25 + 0.25 + 1 + 1) / 4
    assert attention_mse(student, teacher, [(1, 2)], torch.tensor([[1, 1]])).item() == pytest.approx(0.625)


def test_mlm_loss_on_masked_positions_only():
    logits = torch.zeros(1, 3, 4)
    labels = torch.tensor([[-100, 2, -100]])
    assert mlm_loss(logits, labels).item() == pytest.approx(math.log(4), rel=1e-5)


class FakeTokenizer:
    """Enough of a tokenizer for the collator: ids 0-4 are special, 4 is [MASK]."""

    mask_token = "[MASK]"
    mask_token_id = 4
    all_special_ids = (0, 1, 2, 3, 4)
    is_fast = True

    def convert_tokens_to_ids(self, token):
        return 4

    def __len__(self):
        return 50


def test_masker_rate_rule_and_special_tokens():
    ids = torch.randint(5, 50, (200, 50))
    ids[:, 0] = 2
    ids[:, -1] = 0
    masked, labels = Masker(FakeTokenizer(), MlmOptions(rate=0.3), seed=1)(ids)
    chosen = labels != -100
    assert (labels[chosen] == ids[chosen]).all()
    assert not chosen[:, 0].any() and not chosen[:, -1].any()
    assert chosen.float().mean().item() == pytest.approx(0.3 * 48 / 50, abs=0.02)
    as_mask = (masked[chosen] == 4).float().mean().item()
    kept = (masked[chosen] == ids[chosen]).float().mean().item()
    assert as_mask == pytest.approx(0.8, abs=0.03)
    assert kept == pytest.approx(0.1 + 0.1 / 45, abs=0.03)
    assert (masked[~chosen] == ids[~chosen]).all()


def test_masker_whole_word_masks_all_pieces_of_a_word():
    ids = torch.full((300, 6), 7)
    ids[:, 0], ids[:, -1] = 2, 3
    # tokens 1-2 are one word (no gap between offsets), tokens 3-4 another
    offsets = torch.tensor([[0, 0], [0, 2], [2, 4], [5, 7], [7, 8], [0, 0]]).expand(300, 6, 2).clone()
    _, labels = Masker(FakeTokenizer(), MlmOptions(rate=0.5, whole_word=True), seed=0)(ids, offsets)
    chosen = labels != -100
    assert torch.equal(chosen[:, 1], chosen[:, 2]) and torch.equal(chosen[:, 3], chosen[:, 4])
    assert chosen[:, 1].any() and not chosen[:, 1].all()


def test_config_is_validated_at_the_door():
    with pytest.raises(ValidationError, match="every loss weight is 0"):
        LossWeights(soft=0)
    assert LossWeights(soft=0, relation=1).relation == 1
    with pytest.raises(ValidationError, match="whole_word"):
        MlmOptions(whole_word=True, replace_rule=(0.8, 0.1, 0.1))
    with pytest.raises(ValidationError, match="sum to 1"):
        MlmOptions(replace_rule=(0.5, 0.1, 0.1))
    with pytest.raises(ValidationError):
        DistillOptions(temperature=0)
    with pytest.raises(ValidationError, match="train_layers"):
        DistillOptions.model_validate({"augment": {"method": "mlm", "proposer": {"train_layers": -1}}})
    assert MlmOptions(whole_word=True).rule() == (1.0, 0.0, 0.0)


def test_stage_config_reads_yaml_and_round_trips_through_json():
    import json

    import yaml

    from compress.stages.distill import DistillConfig

    text = (
        "type: distill\nlayers: 3\ninit: [0, 2, 5]\n"
        "hidden: {layer_map: [[1, 2], [3, 6]]}\nweights: {soft: 1, hidden: 2}\n"
    )
    cfg = DistillConfig.model_validate(yaml.safe_load(text))
    assert cfg.init == [0, 2, 5] and cfg.hidden.layer_map == [(1, 2), (3, 6)]
    assert DistillConfig.model_validate(json.loads(cfg.model_dump_json())) == cfg
    with pytest.raises(ValidationError):
        DistillConfig(layers=0)
    with pytest.raises(ValidationError, match="extra"):
        DistillConfig.model_validate({"layers": 2, "temprature": 2})
