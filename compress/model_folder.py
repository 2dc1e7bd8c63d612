"""A Hugging Face model folder on disk, checked before anything loads it: which weight files are safe
(safetensors unless the recipe opts in to pickle), and its config and tokenizer.

The lowest layer that touches model files: ``compress.models`` (teachers and students of every
kind) and ``compress.share.model`` (shared checkpoints) both read folders through it.
"""

from __future__ import annotations

from pathlib import Path

from compress.errors import ModelError

WEIGHT_FILES_SAFE = ("model.safetensors", "model.safetensors.index.json")
WEIGHT_FILES_PICKLE = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def check_model_folder(folder: Path, *, allow_pickle: bool = False) -> None:
    """Fail early, with the fix, on a folder that cannot be loaded safely."""
    if not folder.is_dir():
        raise ModelError(f"{folder}: model folder not found")
    if not (folder / "config.json").is_file():
        raise ModelError(f"{folder}: no config.json; point at a Hugging Face model folder")
    if any((folder / f).is_file() for f in WEIGHT_FILES_SAFE):
        _check_safetensors(folder)
        return
    if any((folder / f).is_file() for f in WEIGHT_FILES_PICKLE):
        if allow_pickle:
            return
        raise ModelError(
            f"{folder}: only pickle weights (pytorch_model.bin), which can run code when loaded; "
            "convert to safetensors or set teacher.allow_pickle: true if you trust the file"
        )
    raise ModelError(
        f"{folder}: no model weights (model.safetensors); the folder holds only "
        f"{sorted(p.name for p in folder.iterdir())[:6]}"
    )


def _check_safetensors(folder: Path) -> None:
    """Read every header and tensor slice, so a truncated download fails here and not mid-run."""
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                    handle.get_slice(key)
        except Exception as exc:
            raise ModelError(
                f"{path}: corrupted or truncated safetensors file ({type(exc).__name__}); "
                "re-save or re-download it"
            ) from None


def load_tokenizer(folder: Path, *, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ModelError(
            f"{folder}: cannot load the tokenizer ({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); "
            "the folder needs tokenizer.json or vocab files"
        ) from None


def load_config(folder: Path, *, trust_remote_code: bool = False):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ModelError(
            f"{folder}/config.json: cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})"
        ) from None
