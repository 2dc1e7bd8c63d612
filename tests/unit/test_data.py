"""Data loading: TSV/CSV/JSONL, single and pair text, bare quotes, and clear errors."""

from __future__ import annotations

import json

import pytest

from compress.data import load_file
from compress.errors import DataError


def test_tsv_with_bare_quotes_keeps_them(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text('sentence\tlabel\nthe "Night Train" was great\t1\na 5" screen, awful\t0\n')
    split = load_file(path, text="sentence", label="label")
    assert split.texts == ['the "Night Train" was great', 'a 5" screen, awful']
    assert split.labels == [1, 0] and split.label_names == ["0", "1"]


def test_csv_pairs_and_named_labels(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('a,b,y\n"one, two",three,yes\nfour,five,no\n')
    split = load_file(path, text="a", text_pair="b", label="y", label_names=["no", "yes"])
    assert split.texts == ["one, two", "four"] and split.pairs == ["three", "five"]
    assert split.labels == [1, 0]


def test_jsonl(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        "\n".join(json.dumps({"text": t, "label": y}) for t, y in [("good", 1), ("bad", 0)]) + "\n"
    )
    split = load_file(path, text="text", label="label")
    assert split.texts == ["good", "bad"] and split.labels == [1, 0]


def test_mrpc_style_header_with_spaces(tmp_path):
    path = tmp_path / "mrpc.tsv"
    path.write_text('Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tHe said "yes" .\tHe agreed .\n')
    split = load_file(path, text="#1 String", text_pair="#2 String", label="Quality")
    assert split.texts == ['He said "yes" .'] and split.pairs == ["He agreed ."] and split.labels == [1]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "no data rows"),
        ("sentence\tlabel\n", "no data rows"),
        ("text\tlabel\nhello\t1\n", "missing column 'sentence'; columns are ['text', 'label']"),
        ("sentence\tlabel\nhello\tmaybe\n", "are not integers; list the label names in task.labels"),
        ("sentence\tlabel\n\t1\n", "row 1: empty text in column 'sentence'"),
    ],
)
def test_bad_files_give_one_line(tmp_path, content, expected):
    path = tmp_path / "d.tsv"
    path.write_text(content)
    with pytest.raises(DataError) as info:
        load_file(path, text="sentence", label="label")
    assert expected in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_label_outside_the_label_set(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("sentence\tlabel\nfine\tneutral\n")
    with pytest.raises(DataError, match="label 'neutral' is not one of \\['negative', 'positive'\\]"):
        load_file(path, text="sentence", label="label", label_names=["negative", "positive"])


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        load_file(tmp_path / "none.tsv", text="sentence", label="label")
