"""Atomic file writes, checked reads and content hashes.

Every file compress produces is written to a temporary name in the same folder and renamed into
place, so an interrupted run never leaves a half-written file that looks finished; only a regular
file (or nothing) is ever replaced. Every JSON file compress reads goes through ``read_json`` (a
size, depth and syntax check) and, where its shape matters, ``read_model`` (a pydantic schema), so
a damaged file is one line naming the file, the key and the fix instead of a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from compress.errors import BadFile, CompressError, UnreadableFile
from compress.run_layout import MANIFEST_FILE

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

    Model = TypeVar("Model", bound=BaseModel)

_CHUNK = 1 << 20
MAX_JSON_BYTES = 256 << 20
"""Larger than any report or manifest compress writes; a bigger file is not one of ours."""
MAX_JSON_DEPTH = 64
"""compress nests its JSON at most ~8 levels; deeper documents only exhaust the stack."""
STREAM_NAME = re.compile(r"/dev/(?:(stdout)|(stderr)|fd/(\d+))|/proc/self/fd/(\d+)")
"""Outputs written in place, whatever they point at (a terminal, a pipe, or the file of a shell's
``>``): the user asked for the stream, and replacing the name would swap out /dev/stdout itself.
Matched exactly: ``/dev/fd/../../etc/x`` is a path like any other."""


def stream_descriptor(path: Path) -> int | None:
    """The descriptor a stream name stands for (1, 2 or N), or None for any other path."""
    match = STREAM_NAME.fullmatch(str(path))
    if match is None:
        return None
    stdout, stderr, fd, proc_fd = match.groups()
    return 1 if stdout else 2 if stderr else int(fd or proc_fd)


def is_stream_name(path: Path) -> bool:
    return stream_descriptor(path) is not None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _default_mode(path: Path, base: int) -> None:
    """mkstemp/mkdtemp create private (0600/0700) entries; give results the mode a plain write would."""
    os.chmod(path, base & ~_umask())


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def sha256_json(value: Any) -> str:
    """Hash of a JSON-able value in canonical form (sorted keys, no whitespace)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def file_entries(folder: str | Path) -> list[dict[str, Any]]:
    """Every regular file below ``folder`` (except manifest.json) with its sha256 and size."""
    root = Path(folder)
    entries = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST_FILE:
            continue
        entries.append({"path": rel, "sha256": sha256_file(path), "bytes": path.stat().st_size})
    return entries


def _raise_os_error(path: Path, exc: OSError) -> None:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        reason = "disk quota exceeded" if exc.errno == errno.EDQUOT else "no space left on device"
        raise CompressError(f"{path}: {reason}; free disk space or pass --out on another disk") from exc
    if exc.errno == errno.EFBIG:
        raise CompressError(
            f"{path}: file too large for this file system or the file-size limit (ulimit -f); "
            "raise the limit or pass --out on another disk"
        ) from exc
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        raise CompressError(f"{path}: not writable; choose a writable folder with --out") from exc
    raise CompressError(f"{path}: {exc.strerror or exc}") from exc


def _kind(mode: int) -> str:
    """What a non-regular file is, in words a user recognises."""
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _stat_error(path: Path, exc: OSError, fix: str) -> UnreadableFile:
    """The one-line cause of a failed stat/open: a loop or a permission problem is not 'not found'."""
    if exc.errno == errno.ENOENT:
        return UnreadableFile(f"{path}: not found; {fix}")
    if exc.errno == errno.ELOOP:
        return UnreadableFile(f"{path}: symbolic link loop; point the link at a real file")
    if exc.errno == errno.ENOTDIR:
        return UnreadableFile(f"{path}: a part of the path is a file, not a folder; fix the path")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return UnreadableFile(f"{path}: not readable (permission denied); check its permissions")
    if exc.errno == errno.ENAMETOOLONG:
        return UnreadableFile(f"{path}: file name too long; shorten the path")
    return UnreadableFile(f"{path}: cannot read ({exc.strerror or exc})")


def require_path(path: str | Path, fix: str) -> Path:
    """``path`` if something is there; else one line with the real cause (missing, loop, permission)."""
    path = Path(path)
    try:
        os.stat(path)
    except OSError as exc:
        raise _stat_error(path, exc, fix) from None
    return path


def require_regular_file(path: str | Path, fix: str) -> os.stat_result:
    """The stat of ``path`` if it is a regular file; a folder, FIFO, device or loop is one line."""
    path = Path(path)
    try:
        info = os.stat(path)
    except OSError as exc:
        raise _stat_error(path, exc, fix) from None
    if stat.S_ISDIR(info.st_mode):
        raise UnreadableFile(f"{path}: is a folder, expected a file; {fix}")
    if not stat.S_ISREG(info.st_mode):
        raise UnreadableFile(
            f"{path}: is {_kind(info.st_mode)}, not a regular file; save the content to a file"
        )
    return info


def read_bytes(path: str | Path, *, limit: int = MAX_JSON_BYTES, fix: str = "check the path") -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes.

    A FIFO or device is refused before it is opened (opening a FIFO blocks until a writer comes,
    /dev/zero never ends), and at most ``limit + 1`` bytes are read in case the file grows.
    """
    path = Path(path)
    info = require_regular_file(path, fix)
    if info.st_size > limit:
        raise BadFile(
            f"{path}: {info.st_size} bytes, more than the {limit} compress reads; is it the right file?"
        )
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise _stat_error(path, exc, fix) from None
    if len(data) > limit:
        raise BadFile(f"{path}: more than the {limit} bytes compress reads; is it the right file?")
    return data


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion (the value may be deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def read_json(
    path: str | Path,
    *,
    limit: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    fix: str = "check the path",
    redo: str = "write it again with the command that made it",
) -> Any:
    """A JSON file, checked: a regular file of at most ``limit`` bytes, UTF-8, valid, ``max_depth`` deep.

    ``fix`` is the advice when the file is missing or unreadable, ``redo`` when its content is bad.
    """
    path = Path(path)
    raw = read_bytes(path, limit=limit, fix=fix)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadFile(f"{path}: not UTF-8 (byte {exc.start}); {redo}") from None
    deep = BadFile(f"{path}: JSON nested deeper than {max_depth} levels; {redo}")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise BadFile(f"{path}: not valid JSON ({exc.msg} at {where}); {redo}") from None
    except RecursionError:
        raise deep from None
    except ValueError as exc:  # e.g. an integer literal longer than Python's digit limit
        raise BadFile(f"{path}: not valid JSON ({str(exc).splitlines()[0]}); {redo}") from None
    if _depth(value) > max_depth:
        raise deep
    return value


_UNION_TAG = re.compile(r"^(?:[a-z-]+\[.*\]|int|float|str|bool)$")


def _short(value: Any) -> str:
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxlist, short.maxdict, short.maxstring, short.maxother = 1, 3, 3, 40, 40
    return short.repr(value)


def schema_error_line(path: str | Path, exc: ValidationError, redo: str) -> str:
    """The first schema problem as one line: ``file: key.path: problem (got value); fix``."""
    err = exc.errors()[0]
    loc = ""
    for part in err["loc"]:
        if isinstance(part, str) and _UNION_TAG.match(part):
            continue  # pydantic names the union member it tried (list[int], function-after[...])
        loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
    problem = err["msg"].removeprefix("Value error, ")
    problem = "required key missing" if err["type"] == "missing" else problem[:1].lower() + problem[1:]
    got = "" if err["type"] == "missing" else f" (got {_short(err.get('input'))})"
    return f"{path}: {loc or 'top level'}: {problem}{got}; {redo}"


def read_model(
    path: str | Path,
    model: type[Model],
    *,
    fix: str = "check the path",
    redo: str = "write it again with the command that made it",
) -> Model:
    """A JSON file validated against a pydantic ``model``: what the rest of compress may trust."""
    return check_model(path, read_json(path, fix=fix, redo=redo), model, redo=redo)


def check_model(path: str | Path, data: Any, model: type[Model], *, redo: str) -> Model:
    """``data`` (already read from ``path``) validated against ``model``; one line naming the key if not."""
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadFile(schema_error_line(path, exc, redo)) from None


def _output_kind(target: Path) -> str | None:
    """None for a path compress may replace (a regular file, a link to one, or nothing), else 'stream'.

    Anything else (a folder, FIFO, device or socket) raises: ``os.replace`` would swap it for a file,
    which for ``--junit /dev/null`` as root replaces the system's /dev/null.
    """
    if is_stream_name(target):
        return "stream"
    try:
        info = os.stat(target)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return None  # mkdir below names the file in the way
        raise _stat_error(target, exc, "fix the path") from None
    if stat.S_ISREG(info.st_mode):
        return None
    raise CompressError(
        f"{target}: is {_kind(info.st_mode)}; compress writes its outputs as regular files, "
        "so give a file path (e.g. out/result.json)"
    )


def check_output_path(path: str | Path) -> None:
    """Refuse an output path that cannot be written (a folder, FIFO, device) before minutes of work."""
    _output_kind(Path(path))


@contextlib.contextmanager
def _write_through(target: Path) -> Iterator[Path]:
    """For /dev/stdout and /dev/stderr: build the output privately, then copy it into the stream."""
    folder = Path(tempfile.mkdtemp(prefix="compress-out-"))
    try:
        tmp = folder / target.name
        yield tmp
        # through the process's own descriptor, not a new open of the name: reopening a shell's
        # `> file` would truncate it and write from byte 0 under the lines printed after it
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        try:
            with open(tmp, "rb") as source, os.fdopen(os.dup(stream_descriptor(target)), "wb") as sink:
                shutil.copyfileobj(source, sink)
        except OSError as exc:
            _raise_os_error(target, exc)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it into place only if the block succeeds."""
    target = Path(path)
    if _output_kind(target) == "stream":
        with _write_through(target) as tmp:
            yield tmp
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        _raise_os_error(target.parent, exc)
    tmp = Path(tmp_name)
    try:
        yield tmp
        _default_mode(tmp, 0o666)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        _raise_os_error(target, exc)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | Path, value: Any) -> None:
    write_text_atomic(path, json.dumps(value, indent=2, sort_keys=False, default=str) + "\n")


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; it replaces ``path`` only when the block succeeds.

    A folder named ``.<name>.tmp-*`` is never a finished result: a crashed run leaves one behind
    and the next run deletes it.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    except OSError as exc:
        _raise_os_error(target.parent, exc)
    try:
        yield tmp
        _default_mode(tmp, 0o777)
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        _raise_os_error(target, exc)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
