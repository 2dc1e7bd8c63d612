"""Datasets for classification: local TSV/CSV/JSONL or Hugging Face ``datasets``; single or pair text.

TSV is read with quoting off because real corpora (SST-2, MRPC) contain bare ``"`` characters.
"""

from __future__ import annotations

import csv
import errno
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compress.errors import DataError, missing_dependency
from compress.io import sha256_file, sha256_json

csv.field_size_limit(1 << 24)
MAX_LABEL_ID = 9_999
"""Inferred label names are 0..max id; a larger id is a data error, not a 10**12-entry label list."""
_LABEL_ID = re.compile(r"-?[0-9]{1,12}")
"""ASCII digits only: str.isdigit() also accepts '²' or '١', which int() rejects or misreads."""


@dataclass
class Split:
    """One split in memory. ``labels`` are ids into ``label_names`` (None for unlabelled text)."""

    texts: list[str]
    pairs: list[str] | None
    labels: list[int] | None
    label_names: list[str]
    source: str
    sha256: str

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, indices: list[int]) -> Split:
        return Split(
            texts=[self.texts[i] for i in indices],
            pairs=[self.pairs[i] for i in indices] if self.pairs is not None else None,
            labels=[self.labels[i] for i in indices] if self.labels is not None else None,
            label_names=self.label_names,
            source=f"{self.source}[{len(indices)} rows]",
            sha256=sha256_json([self.sha256, indices]),
        )


def infer_format(path: Path, declared: str | None) -> str:
    if declared:
        return declared
    suffix = path.suffix.lower().lstrip(".")
    if suffix in ("tsv", "csv", "jsonl"):
        return suffix
    raise DataError(f"{path}: cannot tell the format from the name; set format: tsv|csv|jsonl")


def check_data_file(path: Path, fmt: str) -> None:
    """A data file must be a regular file: a FIFO blocks the run and /dev/zero never ends.

    Also names the real cause of a failed stat (a symlink loop or a permission problem is not
    'file not found').
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise DataError(f"{path}: file not found; fix the path") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DataError(f"{path}: symbolic link loop; point the link at the real file") from None
        raise DataError(f"{path}: cannot read ({exc.strerror}); check the path and its permissions") from None
    if stat.S_ISDIR(mode):
        raise DataError(f"{path}: is a folder, expected a {fmt.upper()} file")
    if not stat.S_ISREG(mode):
        raise DataError(f"{path}: not a regular file (a FIFO or device); save the data to a file first")


def _json_row(line: str, path: Path, number: int) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{number}: not valid JSON ({exc.msg}); one JSON object per line") from None
    except RecursionError:
        raise DataError(f"{path}:{number}: JSON nested too deeply; one flat JSON object per line") from None
    except ValueError as exc:  # e.g. an integer longer than Python's digit limit
        raise DataError(f"{path}:{number}: not usable JSON ({str(exc)[:80]}); fix the line") from None
    if not isinstance(row, dict):
        raise DataError(f"{path}:{number}: each line must be a JSON object, got {type(row).__name__}")
    return row


def read_rows(path: Path, fmt: str) -> list[dict[str, Any]]:
    """Rows of a local file as dicts keyed by column name (a UTF-8 byte-order mark is dropped)."""
    check_data_file(path, fmt)
    try:
        if fmt == "jsonl":
            rows = []
            with open(path, encoding="utf-8-sig") as handle:
                for number, line in enumerate(handle, 1):
                    if not line.strip():
                        continue
                    row = _json_row(line, path, number)
                    rows.append(row)
            return rows
        with open(path, encoding="utf-8-sig", newline="") as handle:
            if fmt == "tsv":
                reader = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
            else:
                reader = csv.DictReader(handle)
            rows = list(reader)
            if reader.fieldnames is None:
                return []
            return rows
    except PermissionError:
        raise DataError(f"{path}: not readable; check its permissions") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc}); check the file") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text (byte {exc.start}); convert the file to UTF-8") from None
    except csv.Error as exc:
        raise DataError(f"{path}: malformed {fmt.upper()} ({exc}); check the delimiter and quoting") from None


def read_hub_rows(hub: str, subset: str | None, split: str) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise missing_dependency("datasets", f"data source hub: {hub}") from None
    try:
        ds = datasets.load_dataset(hub, subset, split=split)
    except Exception as exc:
        raise DataError(
            f"hub dataset '{hub}' split '{split}' could not be loaded ({type(exc).__name__}: {exc}); "
            "check the id and your network, or use a local file"
        ) from None
    return [dict(row) for row in ds]


def label_id(value: Any) -> int | None:
    """The integer id a raw label stands for, or None for a name.

    An int (never a bool: JSON true is not label 1) or a string of ASCII digits with an optional
    minus sign; anything else (floats, '1e3', '²', lists) is a name and must be in task.labels.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _LABEL_ID.fullmatch(value):
        return int(value)
    return None


def _raw_label(value: Any) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else str(value).strip()


def _inferred_ids(values: list[Any], where: str, column: str) -> tuple[list[int], list[str]]:
    """Integer labels without task.labels: names are '0'..'N-1' for the largest id N-1."""
    ids = [label_id(v) for v in values]
    if any(i is None for i in ids):
        names = sorted({str(v) for v, i in zip(values, ids, strict=True) if i is None})[:5]
        raise DataError(
            f"{where} column '{column}': labels {names} are not integers; list the label names in task.labels"
        )
    low, high = min(ids), max(ids)
    if low < 0:
        raise DataError(f"{where} column '{column}': negative label {low}; labels must be 0..N-1 or names")
    if high > MAX_LABEL_ID:
        raise DataError(
            f"{where} column '{column}': label id {high} is above {MAX_LABEL_ID}; labels must be 0..N-1 "
            "(renumber them) or names listed in task.labels"
        )
    return ids, [str(i) for i in range(max(high + 1, 2))]


def to_label_ids(
    raw: list[Any], label_names: list[str] | None, where: str, column: str
) -> tuple[list[int], list[str]]:
    """Map raw label values (names or integer ids) to ids; infer names when none are given."""
    values = [_raw_label(v) for v in raw]
    if label_names is None:
        return _inferred_ids(values, where, column)
    index = {name: i for i, name in enumerate(label_names)}
    ids = []
    for number, value in enumerate(values, 1):
        idx = label_id(value)
        if isinstance(value, str) and value in index:
            ids.append(index[value])
        elif idx is not None:
            if not 0 <= idx < len(label_names):
                raise DataError(
                    f"{where} row {number}: label {idx} is outside 0..{len(label_names) - 1} "
                    f"(task.labels: {label_names}); fix the data or task.labels"
                )
            ids.append(idx)
        else:
            shown = value if len(str(value)) <= 60 else f"{str(value)[:60]}…"
            raise DataError(
                f"{where} row {number}: label {shown!r} is not one of {label_names}; "
                "fix the data or task.labels"
            )
    return ids, list(label_names)


def build_split(
    rows: list[dict[str, Any]],
    *,
    where: str,
    text: str,
    text_pair: str | None,
    label: str | None,
    label_names: list[str] | None,
    sha256: str,
    limit: int | None = None,
) -> Split:
    if not rows:
        raise DataError(f"{where}: no data rows; the file is empty or has only a header")
    if limit:
        rows = rows[:limit]
    columns = list(rows[0].keys())
    for col in [c for c in (text, text_pair, label) if c]:
        if col not in columns:
            raise DataError(
                f"{where}: missing column '{col}'; columns are {columns}; "
                "set task.text/text_pair/label or data.<split>.columns"
            )
    texts, pairs = [], [] if text_pair else None
    for number, row in enumerate(rows, 1):
        value = row.get(text)
        if value is None or not str(value).strip():
            raise DataError(f"{where} row {number}: empty text in column '{text}'; remove the row or fill it")
        texts.append(str(value))
        if pairs is not None:
            pair = row.get(text_pair)
            if pair is None:
                raise DataError(f"{where} row {number}: empty text in column '{text_pair}'")
            pairs.append(str(pair))
    labels = None
    names = list(label_names) if label_names else []
    if label:
        raw = [row.get(label) for row in rows]
        for number, value in enumerate(raw, 1):
            if value is None or (isinstance(value, str) and not value.strip()):
                raise DataError(f"{where} row {number}: empty label in column '{label}'")
        labels, names = to_label_ids(raw, label_names, where, label)
    return Split(texts, pairs, labels, names, where, sha256)


def load_source(
    source: Any, task: Any, base_dir: Path, *, labelled: bool = True, label_names: list[str] | None = None
) -> Split:
    """Load one ``DataSource`` of a recipe with the task's column names (per-source overrides win)."""
    text = source.columns.text or task.text
    text_pair = source.columns.text_pair or task.text_pair
    label = (source.columns.label or task.label) if labelled else None
    names = label_names if label_names is not None else task.labels
    if source.path:
        path = Path(source.path).expanduser()
        path = path if path.is_absolute() else base_dir / path
        fmt = infer_format(path, source.format)
        rows = read_rows(path, fmt)
        digest = sha256_file(path)
        where = str(path)
    else:
        rows = read_hub_rows(source.hub, source.subset, source.split)
        digest = sha256_json([source.hub, source.subset, source.split, len(rows)])
        where = f"hub:{source.hub}[{source.split}]"
    return build_split(
        rows,
        where=where,
        text=text,
        text_pair=text_pair,
        label=label,
        label_names=names,
        sha256=sha256_json([digest, source.limit]),
        limit=source.limit,
    )


def load_recipe_split(recipe: Any, name: str) -> Split:
    """Load ``data.<name>`` of a recipe; eval/test take their label names from train."""
    from compress.recipe_base import recipe_dir

    source = getattr(recipe.data, name)
    if source is None:
        raise DataError(f"recipe has no data.{name}; add one")
    base = recipe_dir(recipe)
    if name == "train" or recipe.task.labels:
        return load_source(source, recipe.task, base)
    train = load_source(recipe.data.train, recipe.task, base)
    return load_source(source, recipe.task, base, label_names=train.label_names)


def check_local_splits(recipe: Any) -> dict[str, int]:
    """Read every local data split of a recipe as the run will (columns, labels, text), for validate.

    Hub datasets are skipped (they need the network); the result is the row count per split.
    """
    rows = {}
    for name in ("train", "eval", "test"):
        source = getattr(recipe.data, name)
        if source is not None and source.path:
            rows[name] = len(load_recipe_split(recipe, name))
    return rows


def load_file(
    path: str | Path,
    *,
    text: str,
    text_pair: str | None = None,
    label: str | None = "label",
    label_names: list[str] | None = None,
    fmt: str | None = None,
) -> Split:
    """Load a data file without a recipe (``compress eval --data``)."""
    path = Path(path)
    rows = read_rows(path, infer_format(path, fmt))
    return build_split(
        rows,
        where=str(path),
        text=text,
        text_pair=text_pair,
        label=label,
        label_names=label_names,
        sha256=sha256_file(path),
    )
