"""compress.terminal.routed: descriptors 1 and 2 go to the run log and come back on any exit;
compress's lines and bars keep the terminal, everything else lands in the log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from compress.terminal import routed

REPO = Path(__file__).resolve().parents[2]


def _descriptor(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else set()


@pytest.mark.parametrize("raised", [RuntimeError("stage failed"), KeyboardInterrupt()])
def test_descriptors_come_back_after_an_exception(tmp_path: Path, raised: BaseException):
    before = {fd: _descriptor(fd) for fd in (1, 2)}
    fds = _open_fds()
    log = tmp_path / "run" / "run.log"
    with pytest.raises(type(raised)), routed(log):
        assert {fd: _descriptor(fd) for fd in (1, 2)} == {1: _descriptor_of(log), 2: _descriptor_of(log)}
        os.write(1, b"native stdout line\n")
        os.write(2, b"native stderr line\n")
        raise raised
    assert {fd: _descriptor(fd) for fd in (1, 2)} == before
    assert _open_fds() == fds, "a descriptor leaked"
    text = log.read_text()
    assert "native stdout line" in text and "native stderr line" in text


def _descriptor_of(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


SCRIPT = r"""
import logging, os, sys, warnings
from pathlib import Path
from compress.terminal import FORMAT, TERMINAL, progress, routed

handler = logging.StreamHandler(TERMINAL)  # as compress.cli sets up its logger
handler.setFormatter(logging.Formatter(FORMAT))
ours = logging.getLogger("compress")
ours.handlers[:], ours.propagate = [handler], False
ours.setLevel(logging.INFO)
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

def bar(module):
    # compress's stages make their bars with compress.terminal.progress; other libraries call tqdm
    make = "from compress.terminal import progress as make" if module.startswith("compress.") else (
        "from tqdm.auto import tqdm as make")
    code = make + "\nfor _ in make(range(3), desc=DESC): pass"
    exec(code, {"__name__": module, "DESC": f"bar of {module}"})

try:
    with routed(Path(sys.argv[1])):
        logging.getLogger("compress.stage").info("stage line")
        logging.getLogger("thirdparty").warning("third-party log line")
        warnings.warn("a python warning", FutureWarning)
        print("python stdout line")
        os.write(1, b"native stdout line\n")
        os.write(2, b"W0000 native stderr line\n")
        bar("compress.stages.fake")
        bar("transformers.fake")
        raise RuntimeError("boom")
except RuntimeError as exc:
    print(f"error: {exc}", file=sys.stderr)
print("summary on stdout")
"""


def test_compress_keeps_the_terminal_and_the_rest_goes_to_the_log(tmp_path: Path):
    log = tmp_path / "run.log"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    err = [line for line in done.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert err[0] == "compress: stage line" and err[-1] == "error: boom", done.stderr
    assert all(line.startswith("bar of compress.stages.fake") for line in err[1:-1]), done.stderr
    assert done.stdout == "summary on stdout\n"
    text = log.read_text()
    for line in (
        "compress: stage line",
        "third-party log line",
        "FutureWarning: a python warning",
        "python stdout line",
        "native stdout line",
        "W0000 native stderr line",
        "bar of transformers.fake",
    ):
        assert line in text, f"{line!r} not in the log:\n{text}"
    assert "bar of compress" not in text


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_an_unusable_run_log_is_one_clear_error_and_leaves_the_descriptors(tmp_path: Path, kind: str):
    from compress.errors import CompressError

    log = tmp_path / "run" / "run.log"
    log.parent.mkdir()
    if kind == "directory":
        log.mkdir()
    else:
        log.symlink_to(tmp_path / "elsewhere.log")
    before = {fd: _descriptor(fd) for fd in (1, 2)}
    expected = r"run\.log: cannot open the run log \(.+\); remove or fix it"
    with pytest.raises(CompressError, match=expected), routed(log):
        pass
    assert {fd: _descriptor(fd) for fd in (1, 2)} == before
    assert not (tmp_path / "elsewhere.log").exists()


QUIETED = r"""
import logging, os, sys
from pathlib import Path
from compress.terminal import FORMAT, TERMINAL, quieted, routed

handler = logging.StreamHandler(TERMINAL)  # as compress.cli sets up its logger
handler.setFormatter(logging.Formatter(FORMAT))
ours = logging.getLogger("compress")
ours.handlers[:], ours.propagate = [handler], False
ours.setLevel(logging.DEBUG if sys.argv[1] == "-v" else logging.INFO)

def native(what):
    os.write(2, f"INFO: native stderr line {what}\n".encode())
    os.write(1, f"native stdout line {what}\n".encode())

with quieted():
    logging.getLogger("compress.parity").info("compress line")
    native("kept off")
print("summary on stdout", flush=True)
with routed(Path(sys.argv[2])), quieted():
    native("for the log")
try:
    with quieted():
        native("before a failure")
        raise RuntimeError("boom")
except RuntimeError as exc:
    print(f"error: {exc}", file=sys.stderr)
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_quieted_keeps_native_lines_off_the_terminal_unless_verbose_or_failing(tmp_path: Path, verbose):
    """``quieted`` (check-parity, bundle: commands with no run log): a library's C-level writes to
    descriptors 1 and 2 never reach the terminal, compress's lines do; -v shows them; inside ``routed``
    they stay in the run log; when the block fails they reach stderr, since they may say why."""
    log = tmp_path / "run.log"
    done = subprocess.run(
        [sys.executable, "-c", QUIETED, "-v" if verbose else "-", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == "compress: compress line"
    assert ("INFO: native stderr line kept off" in done.stderr) == verbose, done.stderr
    assert ("native stdout line kept off" in done.stdout) == verbose, done.stdout
    assert "summary on stdout" in done.stdout
    assert (
        "for the log" not in done.stderr + done.stdout
        and "INFO: native stderr line for the log" in log.read_text()
    )
    assert "INFO: native stderr line before a failure" in done.stderr  # said, -v or not
    assert done.stderr.splitlines()[-1] == "error: boom"
