"""Export a fine-tuned classifier to the files a board or phone runs: ONNX (onnxruntime) and TFLite (LiteRT).

Both exporters trace the same wrapper, so every artifact has the same contract: inputs named
``input_ids``, ``attention_mask`` (and ``token_type_ids`` when the model uses them), one output
``logits``. The wrapper takes int32 or int64 ids and casts inside the graph, so a TFLite file can
take int32 (mobile runtimes and GPU delegates reject int64) without changing the model.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch

from compress.errors import ExportError

INPUT_ORDER = ("input_ids", "attention_mask", "token_type_ids")
SAMPLE_TEXTS = [
    "a quiet, well made film that stays with you",
    "bad",
    "the battery died after two days and support never answered my emails about the replacement",
    "not great, not terrible",
    "I would happily stay at this hotel again; the staff were friendly and the room was spotless.",
    "slow service, cold food and a rude waiter made the whole evening feel like a chore",
]
"""Fallback check inputs when the caller has no eval split at hand: short, long, punctuation."""


class Classifier(torch.nn.Module):
    """``(input_ids, attention_mask[, token_type_ids]) -> {"logits": ...}`` for tracing by either exporter."""

    def __init__(self, model: torch.nn.Module, *, additive_mask: bool = False):
        super().__init__()
        self.model = model
        self.names = input_names(model)
        # A 4-D additive float mask: transformers' own 2-D -> 4-D mask builder lowers to GATHER_ND v5
        # in TFLite, which tflite-runtime 2.14 (the Raspberry Pi fallback) cannot load. -1e4, not
        # float32's minimum: an int8 MUL on a mask scaled to the minimum aborts on arm64.
        self.additive_mask = additive_mask

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        mask = attention_mask.long()
        if self.additive_mask:
            mask = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
        kwargs = {"input_ids": input_ids.long(), "attention_mask": mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids.long()
        return {"logits": self.model(**kwargs).logits}


def uses_token_types(model: Any) -> bool:
    """BERT-like models take ``token_type_ids``; DistilBERT-like ones (no type vocabulary) do not."""
    params = inspect.signature(model.forward).parameters
    return "token_type_ids" in params and bool(getattr(model.config, "type_vocab_size", 0))


def input_names(model: Any) -> list[str]:
    return list(INPUT_ORDER if uses_token_types(model) else INPUT_ORDER[:2])


def max_positions(model: Any, default: int = 512) -> int:
    """The longest sequence the model's position table allows (the upper bound of a dynamic axis)."""
    return int(getattr(model.config, "max_position_embeddings", None) or default)


def encode_batch(
    tokenizer: Any,
    texts: list[str],
    pairs: list[str] | None,
    names: list[str],
    *,
    length: int | None,
    max_length: int,
) -> dict[str, Any]:
    """Token arrays for ``names``, padded to ``length`` (fixed-shape TFLite) or else to the longest."""
    padding = "max_length" if length else "longest"
    enc = tokenizer(
        texts, pairs, truncation=True, max_length=length or max_length, padding=padding, return_tensors="np"
    )
    ids = enc["input_ids"]
    return {name: enc[name] if name in enc else ids * 0 for name in names}


def unsupported_op(message: str) -> str | None:
    """The operator named in a converter's "cannot lower this op" error, if there is one."""
    patterns = (
        r"No ONNX function found for <OpOverload\(op='([^']+)', overload='([^']+)'\)>",
        r"Lowering not found: ([\w.:]+)",
        r"[Uu]nsupported (?:operator|op)[: ]+'?([\w.:]+)",
    )
    for pattern in patterns:
        found = re.search(pattern, message)
        if found:
            name = ".".join(g for g in found.groups() if g and g != "default")
            return name.removesuffix(".default")
    return None


def conversion_error(fmt: str, exc: Exception) -> ExportError:
    """One line: which operator could not be converted (when the converter says), else its first line."""
    text = str(exc)
    op = unsupported_op(text)
    if op:
        return ExportError(
            f"{fmt} export: the converter cannot lower operator '{op}'; replace it in the model "
            f"with standard torch ops or pick a target with another format"
        )
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return ExportError(f"{fmt} export failed: {type(exc).__name__}: {first[:300]}")
