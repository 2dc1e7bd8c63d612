"""Saving and reloading shared / factorised / pruned checkpoints with every tensor stored once.

``save_pretrained`` refuses tensors shared between layers (and a plain config cannot describe a
factorised embedding), so a compressed checkpoint is a normal Hugging Face folder whose
``config.json`` carries one extra entry, ``compress_sharing``:

    {"version": 1, "layers": {"part": "layer", "groups": [[0, 1, 2, 3, 4, 5]], "relax_rank": 16} | null,
     "embedding_rank": 128 | null}

``model.safetensors`` holds each unique tensor once, under the first name the model gives it. The
loader rebuilds the architecture from the config, re-applies the structure (factorised embedding,
then ties) and loads the tensors; the ties are real module identities again, not copies.
Vocabulary pruning needs no entry: it only changes ``vocab_size`` and ``tokenizer.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from compress.errors import ModelError

SHARING_KEY = "compress_sharing"
FORMAT_VERSION = 1


def sharing_spec(model: torch.nn.Module) -> dict[str, Any] | None:
    return getattr(model.config, SHARING_KEY, None)


def set_sharing_spec(
    model: torch.nn.Module, *, layers: dict[str, Any] | None = None, embedding_rank: int | None = None
) -> None:
    """Record a transform in the model's config (merging with transforms applied earlier)."""
    spec = dict(sharing_spec(model) or {"version": FORMAT_VERSION, "layers": None, "embedding_rank": None})
    if layers is not None:
        spec["layers"] = layers
    if embedding_rank is not None:
        spec["embedding_rank"] = embedding_rank
    setattr(model.config, SHARING_KEY, spec)


def is_shared_folder(folder: str | Path) -> bool:
    """Whether a checkpoint folder needs ``load_shared_classifier`` (its config has ``compress_sharing``)."""
    try:
        return bool(json.loads((Path(folder) / "config.json").read_text()).get(SHARING_KEY))
    except (OSError, json.JSONDecodeError):
        return False


def unique_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The persistent state with each tensor once, under the first name it appears with."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out[name] = tensor.detach()
    return out


def parameter_stats(model: torch.nn.Module) -> dict[str, int]:
    """Unique parameter count and bytes: what a checkpoint that stores each tensor once must hold."""
    seen: set[int] = set()
    count = size = 0
    for param in model.parameters():
        if id(param) not in seen:
            seen.add(id(param))
            count += param.numel()
            size += param.numel() * param.element_size()
    return {"parameters": count, "bytes": size}


def apply_structure(model: torch.nn.Module, spec: dict[str, Any]) -> None:
    """Give a freshly built model the factorised embedding and ties that ``spec`` describes."""
    from compress.share.factorize import install_factorized
    from compress.share.tying import SharingPlan, tie_layers

    if spec.get("version") != FORMAT_VERSION:
        raise ModelError(
            f"{SHARING_KEY}.version {spec.get('version')!r} is not supported by this compress "
            f"(expects {FORMAT_VERSION}); upgrade compress"
        )
    if spec.get("embedding_rank"):
        install_factorized(model, int(spec["embedding_rank"]))
    if spec.get("layers"):
        tie_layers(model, SharingPlan.from_json(spec["layers"]), init=0, init_relaxation=False)


def save_shared_checkpoint(model: torch.nn.Module, tokenizer: Any, folder: Path) -> None:
    """Write config.json (with ``compress_sharing``), model.safetensors (unique tensors) and the tokenizer."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(str(folder))
    tensors = {name: t.contiguous() for name, t in unique_state_dict(model).items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(folder))


def load_shared_classifier(folder: str | Path) -> tuple[torch.nn.Module, Any]:
    """Load a checkpoint written by ``save_shared_checkpoint``: (model in eval mode, tokenizer)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification

    from compress.model_folder import check_model_folder, load_config, load_tokenizer

    folder = Path(folder)
    check_model_folder(folder)
    config = load_config(folder)
    spec = getattr(config, SHARING_KEY, None)
    if not spec:
        raise ModelError(f"{folder}/config.json: no '{SHARING_KEY}' entry; load it with load_classifier")
    model = AutoModelForSequenceClassification.from_config(config)
    apply_structure(model, spec)
    try:
        stored = load_file(str(folder / "model.safetensors"))
    except Exception as exc:
        raise ModelError(
            f"{folder}/model.safetensors: cannot be read ({type(exc).__name__}); re-save it"
        ) from None
    expected = unique_state_dict(model)
    if set(stored) != set(expected):
        missing, extra = sorted(set(expected) - set(stored)), sorted(set(stored) - set(expected))
        raise ModelError(
            f"{folder}/model.safetensors does not match {SHARING_KEY} in config.json "
            f"(missing {missing[:3]}, unexpected {extra[:3]}); re-save the checkpoint"
        )
    with torch.no_grad():
        for name, tensor in expected.items():
            if tensor.shape != stored[name].shape:
                raise ModelError(
                    f"{folder}/model.safetensors: {name} has shape {tuple(stored[name].shape)}, "
                    f"config.json says {tuple(tensor.shape)}; re-save the checkpoint"
                )
            tensor.copy_(stored[name])
    model.eval()
    return model, load_tokenizer(folder)
