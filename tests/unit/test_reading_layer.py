"""The reading layer (compress.io, compress.data labels) and output paths, tested directly.

The catalogue (tests/integration/test_bad_input.py) drives these through the CLI; here each rule
is pinned where it lives, including the ones that are a success rather than an error: a report
from a newer compress passes ``compress gate``, and ``/dev/stdout`` is written through.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from compress.cli import main
from compress.data import MAX_LABEL_ID, label_id, read_rows, to_label_ids
from compress.errors import BadFile, CompressError, DataError, UnreadableFile
from compress.io import read_json, write_text_atomic
from compress.runtime import runner


def _report(**extra: object) -> dict:
    artifact = {
        "name": "02-export/a",
        "role": "artifact",
        "format": "onnx",
        "bytes": 10,
        "metrics": {"accuracy": 0.8},
    }
    return {
        "schema": "compress.report/1",
        "artifacts": [artifact],
        "gates_config": {"min_accuracy": 0.5},
        **extra,
    }


def test_report_from_a_newer_minor_version_passes_gate(tmp_path: Path):
    """Additions keep the schema version: new top-level, entry and gate keys must not break the gate."""
    report = _report(energy={"joules": 1.0})
    report["artifacts"][0]["metrics"]["energy_mj"] = 3.0
    report["gates_config"]["max_energy_mj"] = 5.0
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    result = CliRunner().invoke(main, ["gate", str(path)])
    assert result.exit_code == 0, result.output
    assert "1 gates: 1 passed" in result.output


def test_newer_major_version_is_refused_with_the_fix(tmp_path: Path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_report(schema="compress.report/2")))
    result = CliRunner().invoke(main, ["gate", str(path)])
    assert result.exit_code == 2
    assert "compress.report/2" in result.output and "compress that wrote it" in result.output


@pytest.mark.parametrize(
    ("make", "expected", "kind"),
    [
        (lambda p: p.mkdir(), "is a folder", UnreadableFile),
        (lambda p: os.mkfifo(p), "FIFO", UnreadableFile),
        (lambda p: p.symlink_to(p), "symbolic link loop", UnreadableFile),
        (lambda p: p.write_text("[" * 200 + "]" * 200), "nested deeper", BadFile),
        (lambda p: p.write_bytes(b'{"a": "caf\xe9"}'), "not UTF-8", BadFile),
        (lambda p: p.write_text('{"a": 1'), "line 1 column 8", BadFile),
    ],
)
def test_read_json_names_the_cause(tmp_path: Path, make, expected: str, kind: type[Exception]):
    path = tmp_path / "x.json"
    make(path)
    with pytest.raises(kind, match=expected) as caught:
        read_json(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_read_json_caps_the_bytes_it_reads(tmp_path: Path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(["x" * 100]))
    with pytest.raises(BadFile, match="more than the 50 compress reads"):
        read_json(path, limit=50)
    assert read_json(path, limit=1000) == ["x" * 100]


def test_read_json_keeps_the_old_exception_families(tmp_path: Path):
    """pipeline.py treats an unreadable or corrupt optional manifest as absent via OSError/ValueError."""
    with pytest.raises(OSError):
        read_json(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError):
        read_json(tmp_path / "bad.json")


def test_atomic_write_refuses_a_fifo_and_leaves_it(tmp_path: Path):
    fifo = tmp_path / "out.xml"
    os.mkfifo(fifo)
    with pytest.raises(CompressError, match="FIFO"):
        write_text_atomic(fifo, "x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.xml"]


def test_atomic_write_refuses_a_link_to_a_device(tmp_path: Path):
    link = tmp_path / "junit.xml"
    link.symlink_to("/dev/null")
    with pytest.raises(CompressError, match="character device"):
        write_text_atomic(link, "x")
    assert link.is_symlink() and os.readlink(link) == "/dev/null"


def test_atomic_write_replaces_a_regular_file(tmp_path: Path):
    path = tmp_path / "a.txt"
    path.write_text("old")
    write_text_atomic(path, "new")
    assert path.read_text() == "new"


@pytest.mark.parametrize("redirect", ["pipe", "file", "append"])
@pytest.mark.parametrize(
    "write",
    [
        "from compress.io import write_json_atomic; write_json_atomic('/dev/stdout', {'ok': 1})",
        "from pathlib import Path; from compress.runtime import runner; "
        "runner.write_text_atomic(Path('/dev/stdout'), '{\"ok\": 1}\\n')",
    ],
    ids=["compress", "runner"],
)
def test_dev_stdout_is_written_through(tmp_path: Path, redirect: str, write: str):
    """``--json /dev/stdout``: the user wants the stream (a pipe, or a file after the shell's ``>`` or
    ``>>``); it is written into at the stream's own position, so lines printed before and after stay
    in order and nothing already in an appended file is lost; /dev/stdout itself is never replaced."""
    code = f"print('before', flush=True); {write}; print('after')"
    folder = tmp_path / "cwd"
    folder.mkdir()
    kept = "old\n" if redirect == "append" else ""
    if redirect == "pipe":
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=folder)
        written = done.stdout
    else:
        (tmp_path / "out.json").write_text("old\n")
        with open(tmp_path / "out.json", "a" if redirect == "append" else "w") as sink:
            done = subprocess.run(
                [sys.executable, "-c", code], stdout=sink, stderr=subprocess.PIPE, text=True, cwd=folder
            )
        written = (tmp_path / "out.json").read_text()
    assert done.returncode == 0, done.stderr
    assert written.startswith(kept + "before\n") and written.endswith("\nafter\n")
    assert json.loads(written[len(kept + "before\n") : -len("after\n")]) == {"ok": 1}
    assert list(folder.iterdir()) == []
    assert Path("/dev/stdout").is_symlink()


def test_only_exact_stream_names_are_written_through():
    from compress.io import is_stream_name

    for name in ("/dev/stdout", "/dev/stderr", "/dev/fd/1", "/proc/self/fd/7"):
        assert is_stream_name(Path(name)) and runner.stream_descriptor(Path(name)) is not None
    for name in ("/dev/fd/../../etc/passwd", "/dev/fd/1/x", "/dev/stdout2", "/proc/self/fd/../x", "/dev/sda"):
        assert not is_stream_name(Path(name)) and runner.stream_descriptor(Path(name)) is None


def test_runner_output_rules(tmp_path: Path):
    fifo = tmp_path / "p.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(runner.RunnerError, match="FIFO or device"):
        runner.write_text_atomic(fifo, "x")
    assert runner.output_is_stream(Path("/dev/stdout")) is True
    assert runner.output_is_stream(tmp_path / "new.jsonl") is False


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, 3),
        ("007", 7),
        ("-1", -1),
        ("\u00b2", None),  # superscript two: str.isdigit() is True, int() fails
        ("\u0661", None),  # Arabic-Indic one: int() would read it as 1
        (True, None),
        (1.0, None),
        ("1e3", None),
        ("1" * 13, None),
    ],
)
def test_label_id_only_takes_plain_integers(value: object, expected: int | None):
    assert label_id(value) == expected


def test_huge_label_id_is_refused_without_allocating():
    with pytest.raises(DataError, match=f"label id {10**12} is above {MAX_LABEL_ID}"):
        to_label_ids([0, 10**12], None, "x.tsv", "label")


def test_byte_order_mark_does_not_hide_the_first_column(tmp_path: Path):
    for name, text in (("a.csv", "sentence,label\nhi,1\n"), ("a.tsv", "sentence\tlabel\nhi\t1\n")):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert list(read_rows(path, name[-3:])[0]) == ["sentence", "label"]


@pytest.mark.parametrize(
    ("config", "limit"),
    [
        ({"model_type": "bert", "max_position_embeddings": 512}, 512),
        ({"model_type": "roberta", "max_position_embeddings": 514}, 512),
        ({"model_type": "deberta-v2"}, None),
    ],
)
def test_position_limit_from_config_only(tmp_path: Path, config: dict, limit: int | None):
    from compress.recipe import position_limit

    (tmp_path / "config.json").write_text(json.dumps(config))
    assert position_limit(tmp_path / "config.json") == limit


def test_worker_turns_a_runtime_parse_error_into_one_model_error(monkeypatch: pytest.MonkeyPatch):
    """A loader's foreign exception on a damaged file (here a stand-in) is a ModelError, not a crash."""
    from compress import evaluate_worker
    from compress.errors import ModelError

    def damaged(*args: object, **kwargs: object) -> None:
        raise ValueError("Error while deserializing header: HeaderTooLarge\nmore detail")

    monkeypatch.setattr(evaluate_worker, "load_torch", damaged)
    request = {"kind": "torch", "model": "m", "threads": 1, "max_length": 8}
    with pytest.raises(ModelError, match="HeaderTooLarge") as caught:
        evaluate_worker.load_model(request)
    assert "\n" not in str(caught.value)


def test_worker_lets_compress_bugs_through_as_themselves(monkeypatch: pytest.MonkeyPatch):
    """A TypeError in compress's own loading code is a bug to report, not "the file may be damaged"."""
    from compress import evaluate_worker

    def buggy(*args: object, **kwargs: object) -> None:
        raise TypeError("load_torch() got an unexpected keyword argument 'x'")

    monkeypatch.setattr(evaluate_worker, "load_torch", buggy)
    with pytest.raises(TypeError, match="unexpected keyword"):
        evaluate_worker.load_model({"kind": "torch", "model": "m", "threads": 1, "max_length": 8})


@pytest.mark.parametrize(
    ("number", "says"),
    [
        (9, "SIGKILL), most often by the out-of-memory killer"),
        (15, "stopped (SIGTERM)"),
        (11, "runtime crashed (SIGSEGV)"),
        (6, "runtime crashed (SIGABRT)"),
    ],
)
def test_a_worker_killed_by_a_signal_is_named_with_its_likely_cause(number: int, says: str):
    from compress.evaluate import killed_line

    line = killed_line("onnx", number)
    assert says in line and "\n" not in line
    assert ("damaged" in line) == (number in (11, 6))


def test_artifact_manifests_carry_a_schema_version_that_both_readers_check(tmp_path: Path):
    from compress.export.artifact import ARTIFACT_SCHEMA
    from compress.subjects import read_artifact_manifest

    assert ARTIFACT_SCHEMA == runner.ARTIFACT_SCHEMA
    manifest = {
        "kind": "artifact",
        "format": "onnx",
        "max_length": 16,
        "files": [{"path": "model.onnx", "sha256": "0" * 64}],
        "added_later": {"kept": True},
    }
    for schema in (None, ARTIFACT_SCHEMA):  # older folders have none; additions keep the version
        (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "schema": schema}))
        assert read_artifact_manifest(tmp_path).format == "onnx"
        assert runner.read_manifest(tmp_path)["format"] == "onnx"
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "schema": "compress.artifact/2"}))
    with pytest.raises(BadFile, match=r"compress\.artifact/2"):
        read_artifact_manifest(tmp_path)
    with pytest.raises(runner.RunnerError, match=r"compress\.artifact/2"):
        runner.read_manifest(tmp_path)


def test_run_file_keeps_newer_loader_flags_but_only_booleans_weaken_safety(tmp_path: Path):
    from compress.subjects import _teacher_load_options

    run = {"recipe_file": "r.yaml", "stages": [], "teacher_load": {"allow_pickle": True, "cache": "v2"}}
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert _teacher_load_options(tmp_path, None) == {"allow_pickle": True}
    run["teacher_load"] = {"trust_remote_code": "yes"}
    (tmp_path / "run.json").write_text(json.dumps(run))
    with pytest.raises(BadFile, match="trust_remote_code"):
        _teacher_load_options(tmp_path, None)
