"""`compress run` shows compress's lines only; other libraries' warnings and logs (the torch and ONNX
exporters, onnxruntime's quantizer, TensorFlow/absl and the LiteRT converter writing to descriptor 2
from C++) land in the run's run.log, and ``-v`` puts them back on the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.tiny import write_recipe

STAGES = "  - type: export\n  - type: quantize\n"
NOISE = ("Warning", "warn(", "W0000", "I0000", "oneDNN", "TracerWarning", "pytree", "WARNING", "LiteRT")


def compress_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "compress.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def segments(text: str) -> list[str]:
    """Lines as a person reads them: a progress bar redraws its line after each carriage return."""
    return [part.strip() for part in text.replace("\r", "\n").splitlines() if part.strip()]


def third_party(text: str) -> list[str]:
    """Segments that are not compress's: its logger prefixes every line, and its bars name the stage."""
    ours = ("compress: ", "finetune epoch", "distill", "teacher outputs", "augment: ", "==== compress")
    return [line for line in segments(text) if not line.startswith(ours)]


def test_run_shows_compress_lines_and_logs_the_rest(tmp_path: Path, tiny_bert_dir: Path, reviews):
    recipe = write_recipe(
        tmp_path / "r.yaml",
        teacher=tiny_bert_dir,
        data=reviews,
        stages=STAGES,
        extra="targets: [android-arm64, arm64-onnx]\n",  # one TFLite length: the converter's noise, once
    )
    runs = tmp_path / "runs"
    done = compress_cli("run", str(recipe), "--out", str(runs))
    assert done.returncode == 0, done.stderr[-3000:]
    assert third_party(done.stderr) == [], done.stderr[-3000:]
    for shown in (done.stderr, done.stdout):
        assert not [line for line in segments(shown) if any(word in line for word in NOISE)], shown
    log = runs / "tiny" / "run.log"
    assert f"compress: other libraries' warnings and logs: {log}" in done.stderr
    logged = log.read_text()
    assert "compress: [2/2] quantize: done" in logged  # the log reads in order with compress's lines
    noise = third_party(logged)
    assert [line for line in noise if any(word in line for word in NOISE)], logged[-3000:]

    # -v: the same kind of noise on the terminal, and nothing more in the log (the ONNX target alone
    # changes the stages' hash, so both run again, quickly)
    verbose = compress_cli("-v", "run", str(recipe), "--out", str(runs), "--set", "targets=[arm64-onnx]")
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    shown = third_party(verbose.stderr)
    assert [line for line in shown if any(word in line for word in NOISE)], verbose.stderr[-3000:]
    assert log.read_text() == logged
