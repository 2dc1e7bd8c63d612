"""Atomic file writes and content hashes.

Every file compress produces is written to a temporary name in the same folder and renamed into
place, so an interrupted run never leaves a half-written file that looks finished.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from compress.errors import CompressError

_CHUNK = 1 << 20


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
        if rel == "manifest.json":
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


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it into place only if the block succeeds."""
    target = Path(path)
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


def read_json(path: str | Path) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


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
