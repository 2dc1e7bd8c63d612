"""Teacher outputs on the transfer set, computed once and cached on disk as safetensors.

The cache key covers the teacher's weights, the transfer data, ``max_length`` and which layers
are kept, so epochs, reruns and later stages (``share``) never pay for the teacher twice. Only
real tokens are stored (packed row after row): for right-padded encoders a token's output does
not depend on how much padding follows it, and padding would multiply the file size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from compress.data import Split
from compress.errors import DataError
from compress.io import atomic_path, sha256_json
from compress.terminal import progress
from compress.training import Encoded, forward_inputs

IGNORE = -100


@dataclass
class TeacherOutputs:
    """Logits for every row; hidden states / attention maps of chosen layers, packed by real token."""

    logits: torch.Tensor
    lengths: torch.Tensor
    hidden: dict[int, torch.Tensor]
    attentions: dict[int, torch.Tensor]

    def _starts(self, square: bool) -> torch.Tensor:
        sizes = self.lengths**2 if square else self.lengths
        return torch.cumsum(sizes, 0) - sizes

    def batch(self, index: torch.Tensor, length: int, layers: bool = True) -> dict[str, Any]:
        """Teacher targets for rows ``index`` padded with zeros to ``length`` tokens; ``layers=False``:
        logits only (the terms being trained use no hidden state or attention map)."""
        index = index.cpu()
        out: dict[str, Any] = {"logits": self.logits[index], "hidden": {}, "attentions": {}}
        if not layers:
            return out
        lengths = self.lengths[index].tolist()
        starts = self._starts(False)[index].tolist()
        for layer, packed in self.hidden.items():
            dense = torch.zeros(len(lengths), length, packed.shape[-1])
            for row, (start, n) in enumerate(zip(starts, lengths, strict=True)):
                dense[row, :n] = packed[start : start + n].float()
            out["hidden"][layer] = dense
        square = self._starts(True)[index].tolist()
        for layer, packed in self.attentions.items():
            heads = packed.shape[0]
            dense = torch.zeros(len(lengths), heads, length, length)
            for row, (start, n) in enumerate(zip(square, lengths, strict=True)):
                dense[row, :, :n, :n] = packed[:, start : start + n * n].float().reshape(heads, n, n)
            out["attentions"][layer] = dense
        return out


def real_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """Tokens per row; fails on left padding, which packing by prefix cannot represent."""
    lengths = attention_mask.sum(dim=1)
    prefix = torch.arange(attention_mask.shape[1])[None, :] < lengths[:, None]
    if not torch.equal(prefix, attention_mask.bool()):
        raise DataError(
            "distill: the tokenizer pads on the left; set padding_side='right' in tokenizer_config.json"
        )
    return lengths


@torch.no_grad()
def compute_outputs(
    teacher: Any, data: Encoded, hidden_layers: list[int], attention_layers: list[int], batch_size: int
) -> dict[str, torch.Tensor]:
    """The teacher's outputs for every row, in row order. The rows run longest first, so that a batch
    holds rows of nearly one length and is trimmed to it: a batch of rows in data order pads each to
    the longest of them, which on SST-2's short sentences more than doubles the tokens computed."""
    teacher.eval()
    if attention_layers:
        teacher.set_attn_implementation("eager")
    lengths = real_lengths(data.attention_mask)
    order = torch.argsort(lengths, descending=True, stable=True)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(data, order.tolist()), batch_size=batch_size, shuffle=False
    )
    logits: list[torch.Tensor] = []
    hidden: dict[int, list[torch.Tensor]] = {k: [] for k in hidden_layers}
    attn: dict[int, list[torch.Tensor]] = {k: [] for k in attention_layers}
    # a bar fed len() and update(), not the loader: tqdm(loader) draws from torch's global generator
    # (an extra DataLoader iterator), which would change the seeded training that follows
    bar = progress(total=len(loader), desc="teacher outputs", leave=False)
    for batch in loader:
        bar.update()
        out = teacher(
            **forward_inputs(teacher, batch),
            output_hidden_states=bool(hidden_layers),
            output_attentions=bool(attention_layers),
        )
        logits.append(out.logits.float())
        for row, n in enumerate(batch["attention_mask"].sum(dim=1).tolist()):
            for k in hidden_layers:
                hidden[k].append(out.hidden_states[k][row, :n].half())
            for k in attention_layers:
                attn[k].append(
                    out.attentions[k - 1][row, :, :n, :n].reshape(out.attentions[k - 1].shape[1], -1).half()
                )
    bar.close()
    place = torch.argsort(order)  # where each row (in data order) ran

    def in_row_order(rows: list[torch.Tensor]) -> list[torch.Tensor]:
        return [rows[i] for i in place.tolist()]

    tensors = {"logits": torch.cat(logits)[place], "lengths": lengths}
    tensors.update({f"hidden.{k}": torch.cat(in_row_order(v)) for k, v in hidden.items()})
    tensors.update({f"attentions.{k}": torch.cat(in_row_order(v), dim=1) for k, v in attn.items()})
    return tensors


def cache_path(cache_dir: Path, key: dict[str, Any]) -> Path:
    return Path(cache_dir) / "distill" / f"teacher-{sha256_json(key)[:24]}.safetensors"


def teacher_outputs(
    teacher: Any,
    data: Encoded,
    *,
    cache_dir: Path,
    teacher_sha: str,
    data_sha: str,
    max_length: int,
    hidden_layers: list[int] | tuple[int, ...] = (),
    attention_layers: list[int] | tuple[int, ...] = (),
    batch_size: int = 64,
) -> TeacherOutputs:
    """Teacher outputs for ``data`` from the cache, computing and storing them on a miss.

    Layers count hidden states from 0 (embeddings) to L; attention layers from 1 to L. Hidden
    states and attention maps are stored in float16 to halve the file; logits stay float32.
    """
    from safetensors.torch import load_file, save_file

    hidden_layers, attention_layers = sorted(set(hidden_layers)), sorted(set(attention_layers))
    key = {
        "teacher": teacher_sha,
        "data": data_sha,
        "max_length": max_length,
        "rows": len(data),
        "hidden": hidden_layers,
        "attentions": attention_layers,
    }
    path = cache_path(cache_dir, key)
    if path.is_file():
        tensors = load_file(str(path))
    else:
        tensors = compute_outputs(teacher, data, hidden_layers, attention_layers, batch_size)
        with atomic_path(path) as tmp:
            save_file(
                {k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"key": json.dumps(key)}
            )
    return TeacherOutputs(
        logits=tensors["logits"],
        lengths=tensors["lengths"],
        hidden={k: tensors[f"hidden.{k}"] for k in hidden_layers},
        attentions={k: tensors[f"attentions.{k}"] for k in attention_layers},
    )


def combine(parts: list[Split]) -> Split:
    """One transfer split from labelled and unlabelled parts; rows without a label get -100."""
    first = parts[0]
    pairs = [p.pairs is not None for p in parts]
    if any(pairs) and not all(pairs):
        raise DataError(
            "distill: unlabelled data must have a text_pair column when the task has sentence pairs"
        )
    labels: list[int] = []
    for part in parts:
        labels += part.labels if part.labels is not None else [IGNORE] * len(part)
    return Split(
        texts=[t for p in parts for t in p.texts],
        pairs=[t for p in parts for t in p.pairs] if all(pairs) else None,
        labels=labels,
        label_names=first.label_names,
        source=" + ".join(p.source for p in parts),
        sha256=sha256_json([p.sha256 for p in parts]),
    )
