"""benchmarks/embedding_bits.py on a tiny finished run: both table widths, held-out rows and dev."""

from __future__ import annotations

import pytest

from benchmarks.embedding_bits import compare, read_rows
from compress.export.onnx import export_onnx
from compress.models import load_classifier
from compress.targets import load_target
from tests.helpers.tiny import NEGATIVE, POSITIVE


def write_tsv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows), encoding="utf-8")


def finished_run(tmp_path, tiny_bert_dir, per_label: int):
    """A suite work folder holding one run's fp32 ONNX export, and ``per_label`` rows of each label."""
    model, tokenizer = load_classifier(tiny_bert_dir)
    work = tmp_path / "benchmarks-headline" / "sst2"
    fp32 = work / "runs" / "sst2-distil3" / "03-export" / "arm64-onnx-fp32"
    export_onnx(model, tokenizer, fp32, load_target("arm64-onnx"), name="03-export/arm64-onnx-fp32")
    rows = [(f"{POSITIVE[i % len(POSITIVE)]} film", 1) for i in range(per_label)]
    rows += [(f"{NEGATIVE[i % len(NEGATIVE)]} film", 0) for i in range(per_label)]
    return work, rows


def test_compare_quantizes_one_export_both_ways_and_measures_each_split(tmp_path, tiny_bert_dir):
    work, rows = finished_run(tmp_path, tiny_bert_dir, 6)
    write_tsv(work / "data" / "heldout.tsv", rows[::2])
    write_tsv(tmp_path / "dev.tsv", rows[1::2])

    out = compare(work, "sst2", read_rows(tmp_path / "dev.tsv", "sst2"), tmp_path / "scratch")

    assert out["rows"] == {"heldout": 6, "dev": 6}
    assert out["int4"]["bytes"] < out["int8"]["bytes"] < out["fp32"]["bytes"]
    for name in ("int8", "int4"):
        for key in ("heldout_accuracy", "dev_accuracy", "heldout_agreement_fp32", "dev_agreement_fp32"):
            assert 0.0 <= out[name][key] <= 1.0
    assert "heldout_agreement_fp32" not in out["fp32"]
    manifests = sorted((tmp_path / "scratch").glob("*/manifest.json"))
    names = [m.parent.name for m in manifests]
    assert names == ["benchmarks-headline-sst2-int4", "benchmarks-headline-sst2-int8"]
    assert out["run"] == "benchmarks-headline/sst2"  # never the machine's absolute path

    (work / "runs" / "another").mkdir()
    with pytest.raises(SystemExit, match="expected one run folder, found"):
        compare(work, "sst2", read_rows(tmp_path / "dev.tsv", "sst2"), tmp_path / "scratch2")


def test_other_table_storages_are_named_variants(tmp_path, tiny_bert_dir):
    work, rows = finished_run(tmp_path, tiny_bert_dir, 4)
    write_tsv(work / "data" / "heldout.tsv", rows)
    write_tsv(tmp_path / "dev.tsv", rows)
    dev = read_rows(tmp_path / "dev.tsv", "sst2")

    out = compare(work, "sst2", dev, tmp_path / "scratch", ("int4", "int4-b16", "int8", "float-tables"))

    # smaller blocks carry more scales; fp32 tables beside int8 matmuls are the largest quantized file
    sizes = [out[name]["bytes"] for name in ("int4", "int4-b16", "int8", "float-tables", "fp32")]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
