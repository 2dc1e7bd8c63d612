"""Shared fixtures: offline hub, no litter in the working directory, tiny models built in code."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tests.helpers.tiny import NEGATIVE, POSITIVE, make_tiny_bert, write_reviews

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _offline_and_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Every test runs offline in its own folder; a test that writes into the repo fails."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    before = {p.name for p in REPO.iterdir()}
    yield
    littered = {p.name for p in REPO.iterdir()} - before
    assert not littered, f"test wrote into the repository: {sorted(littered)}"


@pytest.fixture(autouse=True)
def _compress_logger_restored():
    """`compress.cli.main` gives the "compress" logger its own stderr handler and stops propagation;
    put it back after each test, so a later test's caplog sees compress's records whatever ran first."""
    ours = logging.getLogger("compress")
    saved = (list(ours.handlers), ours.level, ours.propagate)
    yield
    ours.handlers[:] = saved[0]
    ours.setLevel(saved[1])
    ours.propagate = saved[2]


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved 2-layer, hidden-32 BertForSequenceClassification with a fast tokenizer (2 labels)."""
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture
def reviews(tmp_path: Path) -> dict[str, Path]:
    """A tiny labelled corpus (train/dev/test TSV) with learnable word cues."""
    return write_reviews(tmp_path / "data")


__all__ = ["NEGATIVE", "POSITIVE"]
