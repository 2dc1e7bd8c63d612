"""What a person sees during ``compress run``: compress's own lines and progress bars, nothing else.

Third-party noise comes from three places: Python ``warnings``, other libraries' ``logging``, and
C/C++ code (TensorFlow/absl, oneDNN, the LiteRT converter) that writes straight to file
descriptors 1 and 2. Only redirecting the descriptors catches the last kind, and it catches the
first two as well, since ``sys.stderr`` and the handlers bound to it write through descriptor 2.
So while a run works, descriptors 1 and 2 point at the run's log file and compress's own output
goes to a saved copy of the terminal's stderr through ``TERMINAL``: the "compress" logger, and the
progress bars compress creates with ``progress``. A command without a run log (``check-parity``,
``bundle``) keeps a library's C++ lines off the terminal with ``quieted`` around the call that writes them.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO


class _Terminal(io.TextIOBase):
    """The person's stderr, wherever descriptor 2 points: the saved stream while ``routed`` holds
    descriptor 2, else whatever ``sys.stderr`` is at the time of the write (so test runners that
    swap ``sys.stderr`` still see compress's lines)."""

    def __init__(self) -> None:
        super().__init__()
        self.saved: TextIO | None = None

    @property
    def stream(self) -> TextIO:
        return self.saved or sys.stderr

    def write(self, text: str) -> int:
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"


TERMINAL = _Terminal()
"""Where compress's own lines and bars go; the CLI's log handler writes here."""

FORMAT = "compress: %(message)s"


def _fd_of(stream: Any) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def progress(iterable: Any = None, **kwargs: Any) -> Any:
    """A compress progress bar (tqdm, every keyword passed on): it draws on ``TERMINAL``, the person's
    stderr, also while ``routed`` points descriptor 2 at the run log. Other libraries' bars keep
    tqdm's default ``sys.stderr`` and so land in the log."""
    from tqdm.auto import tqdm

    kwargs.setdefault("dynamic_ncols", True)  # tqdm sizes only sys.stderr/stdout bars by default
    return tqdm(iterable, file=TERMINAL, **kwargs)


@contextlib.contextmanager
def routed(log_path: Path) -> Iterator[Path]:
    """Send descriptors 1 and 2 (and so every third-party writer) to ``log_path``, appended, while
    compress's logger and progress bars keep the terminal; restore both descriptors on any exit,
    an exception or Ctrl-C included, so the CLI's one-line error reaches the person."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    _flush(sys.stdout, sys.stderr)
    with contextlib.ExitStack() as undo:  # undoes in reverse order whatever was done before a failure
        try:  # never through a planted symlink
            log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            from compress.errors import CompressError

            reason = "it is a symbolic link" if os.path.islink(log_path) else exc.strerror
            raise CompressError(
                f"{log_path}: cannot open the run log ({reason}); remove or fix it, or pass -v to keep "
                "other libraries' output on the terminal"
            ) from None
        undo.callback(os.close, log_fd)
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        os.write(log_fd, f"\n==== compress (pid {os.getpid()}) {stamp} ====\n".encode())
        terminal = _terminal_stream(_saved(2, undo))
        _saved(1, undo)
        undo.callback(_flush, sys.stdout, sys.stderr)  # what libraries buffered lands in the log
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        undo.enter_context(_lines_to(terminal))
        yield log_path


def verbose() -> bool:
    """Whether the person passed -v: the CLI sets the "compress" logger to DEBUG for it."""
    return logging.getLogger("compress").isEnabledFor(logging.DEBUG)


@contextlib.contextmanager
def quieted() -> Iterator[None]:
    """What third-party code writes to descriptors 1 and 2 in the block (LiteRT's C++ "INFO: Created
    TensorFlow Lite XNNPACK delegate for CPU.") goes to a scratch file instead of the terminal, for a
    command with no run log; compress's own lines keep the terminal through ``TERMINAL``. Nothing
    changes under -v (the person asked for those lines) or inside ``routed`` (descriptor 2 is the run
    log already). When the block raises, the scratch file's lines reach stderr after all: they may say
    why it failed."""
    if TERMINAL.saved is not None or verbose():
        yield
        return
    _flush(sys.stdout, sys.stderr)
    with tempfile.TemporaryFile() as scratch:
        try:
            with contextlib.ExitStack() as undo:
                terminal = _terminal_stream(_saved(2, undo))
                _saved(1, undo)
                undo.callback(_flush, sys.stdout, sys.stderr)  # what libraries buffered lands in scratch
                os.dup2(scratch.fileno(), 1)
                os.dup2(scratch.fileno(), 2)
                TERMINAL.saved = terminal
                try:
                    yield
                finally:
                    TERMINAL.saved = None
                    _flush(terminal)
                    if terminal is not sys.stderr:
                        terminal.close()
        except BaseException:
            scratch.seek(0)
            sys.stderr.write(scratch.read().decode("utf-8", errors="backslashreplace"))
            sys.stderr.flush()
            raise


def _saved(fd: int, undo: contextlib.ExitStack) -> int:
    """A copy of descriptor ``fd``, put back in its place and closed when ``undo`` unwinds."""
    copy = os.dup(fd)  # not inheritable: child processes never get the terminal
    undo.callback(os.close, copy)
    undo.callback(os.dup2, copy, fd)
    return copy


def _terminal_stream(fd: int) -> TextIO:
    """A stream on the saved copy of descriptor 2, or ``sys.stderr`` itself when it does not write
    through descriptor 2 (a test runner's buffer, which the redirect does not reach)."""
    if _fd_of(sys.stderr) != 2:
        return sys.stderr
    return open(fd, "w", buffering=1, encoding=TERMINAL.encoding, errors="backslashreplace", closefd=False)


@contextlib.contextmanager
def _lines_to(terminal: TextIO) -> Iterator[None]:
    """compress's lines go to ``terminal`` (via ``TERMINAL``) and, through descriptor 2, to the log
    too, so the log reads in order: which stage was running when a library said something."""
    ours = logging.getLogger("compress")
    to_log = logging.StreamHandler(
        open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    )
    to_log.setFormatter(logging.Formatter(FORMAT))
    ours.addHandler(to_log)
    TERMINAL.saved = terminal
    try:
        yield
    finally:
        TERMINAL.saved = None
        ours.removeHandler(to_log)
        to_log.close()
        to_log.stream.close()
        _flush(terminal)
        if terminal is not sys.stderr:
            terminal.close()


def _flush(*streams: Any) -> None:
    for stream in streams:
        with contextlib.suppress(Exception):
            stream.flush()
