"""Student construction: chosen teacher layers are copied exactly, for every supported family."""

from __future__ import annotations

import pytest
import torch

from compress.distill.student import build_student, choose_layers, layer_list_path
from compress.errors import ModelError


def tiny_teacher(family: str, layers: int = 4, groups: int = 1):
    import transformers as t

    common = {"vocab_size": 120, "max_position_embeddings": 64, "num_labels": 2}
    configs = {
        "bert": lambda: t.BertConfig(
            hidden_size=32, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=48, **common
        ),
        "roberta": lambda: t.RobertaConfig(
            hidden_size=32, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=48, **common
        ),
        "distilbert": lambda: t.DistilBertConfig(dim=32, n_layers=layers, n_heads=2, hidden_dim=48, **common),
        "albert": lambda: t.AlbertConfig(
            embedding_size=16,
            hidden_size=32,
            num_hidden_layers=layers,
            num_hidden_groups=groups,
            num_attention_heads=2,
            intermediate_size=48,
            **common,
        ),
    }
    torch.manual_seed(0)
    return t.AutoModelForSequenceClassification.from_config(configs[family]()).eval()


def blocks(model):
    module = model
    for part in layer_list_path(model).split("."):
        module = getattr(module, part)
    return module


def same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
@pytest.mark.parametrize(("init", "expected"), [("every-other", [0, 2]), ([3, 1], [3, 1])])
def test_student_layers_equal_chosen_teacher_layers(family, init, expected):
    teacher = tiny_teacher(family)
    student, info = build_student(teacher, 2, init)
    assert info["teacher_layers"] == expected
    assert len(blocks(student)) == 2
    for s, t in enumerate(expected):
        assert same(blocks(student)[s], blocks(teacher)[t])
    assert same(student.base_model.embeddings, teacher.base_model.embeddings)
    assert info["fresh_tensors"] == []


def test_student_matches_teacher_when_nothing_is_dropped():
    teacher = tiny_teacher("bert", layers=2)
    student, _ = build_student(teacher, 2, "every-other")
    ids = torch.randint(5, 120, (3, 9))
    assert torch.allclose(student(input_ids=ids).logits, teacher(input_ids=ids).logits, atol=1e-5)


def test_albert_shared_group_is_copied_and_depth_reduced():
    teacher = tiny_teacher("albert", layers=4, groups=1)
    student, _ = build_student(teacher, 2, "every-other")
    assert student.config.num_hidden_layers == 2
    assert same(blocks(student)[0], blocks(teacher)[0])
    assert same(student.base_model.embeddings, teacher.base_model.embeddings)


def test_albert_one_group_per_layer_copies_chosen_groups():
    teacher = tiny_teacher("albert", layers=4, groups=4)
    student, _ = build_student(teacher, 2, [1, 3])
    assert same(blocks(student)[0], blocks(teacher)[1])
    assert same(blocks(student)[1], blocks(teacher)[3])


def test_random_init_copies_embeddings_but_not_layers():
    teacher = tiny_teacher("bert")
    student, info = build_student(teacher, 2, "random")
    assert info["teacher_layers"] is None
    assert same(student.base_model.embeddings, teacher.base_model.embeddings)
    assert not same(blocks(student)[0], blocks(teacher)[0])


def test_narrower_student_keeps_only_matching_shapes():
    teacher = tiny_teacher("bert")
    student, info = build_student(teacher, 2, "every-other", hidden_size=16, intermediate_size=24)
    assert student.config.hidden_size == 16
    assert student.config.intermediate_size == 24
    assert any("embeddings.word_embeddings" in key for key in info["fresh_tensors"])


def test_student_errors_name_the_key():
    teacher = tiny_teacher("bert")
    with pytest.raises(ModelError, match="layers: 5 is more than the teacher's 4"):
        build_student(teacher, 5)
    with pytest.raises(ModelError, match=r"init: teacher layer\(s\) \[7\] out of range"):
        build_student(teacher, 2, [0, 7])
    with pytest.raises(ModelError, match="hidden_size: 31 is not divisible"):
        build_student(teacher, 2, hidden_size=31)


def test_every_other_spreads_when_more_than_half_the_layers():
    assert choose_layers("every-other", 6, 3) == [0, 2, 4]
    assert choose_layers("every-other", 6, 4) == [0, 1, 3, 4]
