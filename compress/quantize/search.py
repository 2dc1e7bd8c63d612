"""Accuracy-aware int8: keep the most sensitive layers float, as few as ``tolerable_loss`` allows.

1. Sensitivity scan: for each unit (a transformer block, or a Linear outside the blocks), quantize
   only that unit (neural-compressor PT2E static int8, calibrated on training texts) and measure how
   far the logits move from the float model's.
2. Candidates: the k most sensitive units kept float, k = 0, 1, 2, 4, ... (fewest first = fastest).
3. ``neural_compressor.torch.autotune`` tries them in order and stops at the first whose eval metric
   is within ``tolerable_loss`` of the float model's; if none is, it returns the best one found and
   the quantize stage fails unless the recipe allows the miss.

The winner is a PT2E int8 graph; ``pt2e_onnx.export_search_winner`` exports it to ONNX (int8 MatMuls
in onnxruntime), and the same float-layer list goes to ai-edge-quantizer's scopes for TFLite.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compress.errors import ExportError
from compress.export import Classifier, encode_batch, max_positions

log = logging.getLogger(__name__)

Rows = tuple[list[str], list[str] | None]
SCAN_ROWS = 64
SCAN_BATCHES = 4
"""The scan calibrates each one-unit trial on 4 batches of 8 texts and scores it on 64 eval texts."""


@dataclass
class SearchResult:
    float_layers: list[str]
    """Module names of the model (``bert.encoder.layer.5.output.dense``) kept float."""
    met: bool
    baseline: float
    score: float
    trials: list[dict[str, Any]]
    sensitivity: dict[str, float]
    calibration_samples: int
    max_positions: int
    model: Any = field(repr=False)
    float_weights: set[str] = field(repr=False)
    """Fingerprints of the float layers' weights (``compress.quantize.constants.weight_fingerprints``)."""
    example: tuple = field(repr=False)
    check_batches: list[tuple] = field(repr=False)

    def summary(self) -> dict[str, Any]:
        return {
            "tool": "neural_compressor.torch autotune (PT2E static int8)",
            "met": self.met,
            "baseline": self.baseline,
            "score": self.score,
            "float_layers": self.float_layers,
            "trials": self.trials,
            "sensitivity": self.sensitivity,
        }


def batches(tokenizer: Any, names: list[str], rows: Rows, max_length: int, size: int = 32) -> list[tuple]:
    """Tensor tuples (in ``names`` order), each batch padded to its own longest text."""
    import torch

    texts, pairs = rows
    out = []
    for start in range(0, len(texts), size):
        chunk_pairs = pairs[start : start + size] if pairs is not None else None
        feeds = encode_batch(
            tokenizer, texts[start : start + size], chunk_pairs, names, length=None, max_length=max_length
        )
        out.append(tuple(torch.from_numpy(feeds[n]) for n in names))
    return out


def logits_of(model: Any, data: list[tuple]) -> Any:
    import torch

    with torch.no_grad():
        return torch.cat([model(*batch)["logits"].float() for batch in data])


def search_units(module: Classifier) -> list[str]:
    """What the search keeps float: each transformer block, plus every Linear outside the blocks (pooler,
    classifier, a factorised embedding's projection). Names as the traced graph sees them (``model.``).

    Block granularity keeps the scan to a handful of trials (7-8 for a 6-layer model); a block that
    is reused at several positions (cross-layer sharing) is one unit.
    """
    import torch

    lists = [(n, m) for n, m in module.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1]
    blocks_name, blocks = max(lists, key=lambda item: len(item[1])) if lists else ("", [])
    units, seen = [], set()
    for index, block in enumerate(blocks):
        if id(block) not in seen:
            seen.add(id(block))
            units.append(f"{blocks_name}.{index}")
    inside = {id(m) for block in blocks for m in block.modules()}
    units += [n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear) and id(m) not in inside]
    return units


def fresh_copy(graph: Any) -> Any:
    """A copy neural-compressor can prepare (it reads ``_exported``/``dynamic_shapes`` off the module)."""
    clone = copy.deepcopy(graph)
    clone._exported, clone.dynamic_shapes = True, graph.dynamic_shapes
    return clone


def quantized(graph: Any, config: Any, calibration: list[tuple]) -> Any:
    from neural_compressor.torch.quantization import convert, prepare

    prepared = prepare(fresh_copy(graph), config)
    with __import__("torch").no_grad():
        for batch in calibration:
            prepared(*batch)
    return convert(prepared)


def keep_float(layers: list[str]) -> Any:
    """Static int8 everywhere except ``layers``."""
    from neural_compressor.torch.quantization import StaticQuantConfig

    config = StaticQuantConfig()
    for layer in layers:
        config.set_local(layer, StaticQuantConfig(w_dtype="fp32", act_dtype="fp32"))
    return config


def sensitivity_scan(
    graph: Any, layers: list[str], calibration: list[tuple], scan: list[tuple], reference: Any
) -> dict[str, float]:
    """Mean squared logit change when only one unit is int8: larger means keep it float first."""
    from neural_compressor.torch.quantization import StaticQuantConfig

    scores = {}
    for layer in layers:
        config = StaticQuantConfig(w_dtype="fp32", act_dtype="fp32")
        config.set_local(layer, StaticQuantConfig())
        moved = logits_of(quantized(graph, config, calibration), scan)
        scores[layer] = float(((moved - reference) ** 2).mean())
    return scores


def candidate_counts(total: int, max_trials: int) -> list[int]:
    counts, k = [0], 1
    while k <= total and len(counts) < max_trials:
        counts.append(k)
        k *= 2
    return counts


def search_float_layers(
    model: Any,
    tokenizer: Any,
    calibration: Rows,
    evaluation: tuple[list[str], list[str] | None, list[int] | None],
    *,
    tolerable_loss: float,
    metric: str,
    max_trials: int,
    max_length: int,
    fixed_layers: list[str] | None = None,
) -> SearchResult:
    """Find the fewest float layers that keep the eval metric within ``tolerable_loss`` of float."""
    import torch
    from neural_compressor.torch.export import export
    from neural_compressor.torch.quantization import TuningConfig, autotune

    module = Classifier(model.eval()).eval()
    names = module.names
    calib = batches(tokenizer, names, calibration, max_length, size=8)
    texts, pairs, labels = evaluation
    evals = batches(tokenizer, names, (texts, pairs), max_length)
    scan = batches(tokenizer, names, (texts[:SCAN_ROWS], pairs[:SCAN_ROWS] if pairs else None), max_length)
    reference = logits_of(module, evals)
    truth = torch.tensor(labels) if metric == "accuracy" and labels is not None else reference.argmax(-1)
    batch = torch.export.Dim("batch", min=1, max=4096)
    sequence = torch.export.Dim("sequence", min=1, max=max_positions(model))
    example = calib[0]
    graph = export(module, example, dynamic_shapes=tuple({0: batch, 1: sequence} for _ in names))
    fixed = [f"model.{layer}" for layer in fixed_layers or []]
    layers = [unit for unit in search_units(module) if unit not in fixed]
    scores = sensitivity_scan(graph, layers, calib[:SCAN_BATCHES], scan, logits_of(module, scan))
    ranked = sorted(layers, key=lambda layer: -scores[layer])
    counts = candidate_counts(len(ranked), max_trials)
    candidates = [fixed + ranked[:k] for k in counts]
    seen: list[float] = []

    def evaluate(candidate: Any) -> float:
        seen.append(float((logits_of(candidate, evals).argmax(-1) == truth).float().mean()))
        return seen[-1]

    def calibrate(prepared: Any) -> None:
        with torch.no_grad():
            for item in calib:
                prepared(*item)

    tuning = TuningConfig(
        config_set=[keep_float(c) for c in candidates],
        tolerable_loss=tolerable_loss,
        max_trials=len(candidates),
    )
    winner = autotune(graph, tuning, eval_fn=evaluate, run_fn=calibrate)
    if winner is None:
        raise ExportError("quantize: the accuracy-aware search produced no model")
    baseline, results = seen[0], seen[1 : len(candidates) + 1]
    threshold = baseline * (1 - tolerable_loss)
    passed = [i for i, s in enumerate(results) if s >= threshold]
    best = passed[0] if passed else int(np.argmax(results))
    trials = [
        {"float_layers": len(candidates[i]), "score": s, "passed": s >= threshold}
        for i, s in enumerate(results)
    ]
    from compress.quantize.constants import weight_fingerprints

    strip = len("model.")
    kept = set().union(*(weight_fingerprints(module.get_submodule(layer)) for layer in candidates[best]))
    return SearchResult(
        float_layers=[layer[strip:] for layer in candidates[best]],
        met=bool(passed),
        baseline=baseline,
        score=results[best],
        trials=trials,
        sensitivity={k[strip:]: v for k, v in scores.items()},
        calibration_samples=len(calibration[0]),
        max_positions=max_positions(model),
        model=winner,
        float_weights=kept,
        example=example,
        check_batches=batches(
            tokenizer, names, (texts[:16], pairs[:16] if pairs else None), max_length, size=8
        ),
    )
