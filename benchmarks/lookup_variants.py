"""What reading the int4 embedding tables costs at batch 1 (issue 19).

The headline's ONNX int8 artifact stored its lookup tables in int4 blocks read by ONNX Runtime's
``GatherBlockQuantized``, which the op profile put at 13-16% of the kernel time. This times one such
artifact (``quantize.embedding_lookup: blocked``), in interleaved rounds, four ways that hold the same
int4 bytes:

- ``as stored``: the file as the quantize stage writes it with ``embedding_lookup: blocked``;
- ``fold``: what ``embedding_lookup: fold`` (the default since session 20) writes instead: the same int4
  initializers read by constant ``Cast``/``Sub``/``Mul``/``Reshape`` nodes, which ONNX Runtime folds into a
  float table at load with its default options (``compress.quantize.onnx.fold_block_lookups``);
- ``dequantize, folded``: every ``GatherBlockQuantized`` rewritten as ``DequantizeLinear`` (the same blocks,
  scales and zero points) then a plain ``Gather``, with the session option ``session.disable_quant_qdq=1``,
  under which ONNX Runtime folds the constant ``DequantizeLinear`` into a float table at load;
- ``dequantize, not folded``: the same graph without that option (ONNX Runtime keeps ``DequantizeLinear``
  on constants for its QDQ fusions, so every call dequantizes every table: what a user who loads the
  rewritten file with default options gets).

Each variant's logits are compared with the stored file's on the same requests. Latency is a measurement:
run it alone on the machine.

    python benchmarks/lookup_variants.py runs/benchmarks/sst2/runs/sst2-distil3/04-quantize/arm64-onnx-int8 \\
        --out benchmarks/results/lookup_variants_sst2.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if not __package__:  # run as ``python benchmarks/lookup_variants.py``: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compress.quantize.onnx import fold_block_lookups

VARIANTS = ("as stored", "fold", "dequantize, folded", "dequantize, not folded")


def dequantized_lookups(model: Any) -> Any:
    """A copy of ``model`` in which every ``GatherBlockQuantized`` is ``DequantizeLinear`` + ``Gather``
    on the same int4 initializers (opset 21 block quantization)."""
    import onnx
    from onnx import helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes, rewritten = [], 0
    for node in out.graph.node:
        if node.op_type != "GatherBlockQuantized":
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        table, indices, scales, *zero_point = node.input
        dense = f"{node.name}_dequantized"
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [table, scales, *zero_point],
                [dense],
                name=f"{node.name}_dq",
                axis=attrs.get("quantize_axis", 1),
                block_size=attrs.get("block_size", 128),
            )
        )
        nodes.append(
            helper.make_node(
                "Gather",
                [dense, indices],
                list(node.output),
                name=f"{node.name}_gather",
                axis=attrs.get("gather_axis", 0),
            )
        )
        rewritten += 1
    if not rewritten:
        raise SystemExit(
            "the model has no GatherBlockQuantized node: quantize it with embedding_bits: 4 and "
            "embedding_lookup: blocked"
        )
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def sessions(model_path: Path, model: Any, threads: int) -> dict[str, Any]:
    """One onnxruntime session per variant of ``model`` (loaded from ``model_path``)."""
    import onnxruntime as ort

    def session(blob: bytes, fold: bool) -> Any:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        if fold:
            options.add_session_config_entry("session.disable_quant_qdq", "1")
        return ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"])

    rewritten = dequantized_lookups(model).SerializeToString()
    folded = type(model)()
    folded.CopyFrom(model)
    fold_block_lookups(folded)
    return {
        "as stored": session(model_path.read_bytes(), False),
        "fold": session(folded.SerializeToString(), False),
        "dequantize, folded": session(rewritten, True),
        "dequantize, not folded": session(rewritten, False),
    }


def vocab_size(model: Any) -> int:
    """Rows of the table that ``input_ids`` index (the word table, pruned or not; a folded lookup's
    table is computed from its int4 initializer, whose first axis is the rows)."""
    shapes = {i.name: list(i.dims) for i in model.graph.initializer}
    made_by = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type in ("Gather", "GatherBlockQuantized") and "input_ids" in node.input[1]:
            table = node.input[0]
            while table not in shapes and table in made_by:
                table = made_by[table].input[0]
            return int(shapes[table][0])
    raise SystemExit("no lookup reads input_ids: is this a compress text-classifier artifact?")


def requests(session: Any, lengths: list[int], vocab: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Batch-1 feeds of the given token lengths: random word ids below ``vocab`` (past the first 100,
    where BERT vocabularies keep special and unused tokens, when the table is large enough), a full
    attention mask, token type 0."""
    rng = np.random.default_rng(seed)
    low = 100 if vocab > 1000 else 0
    out = []
    for length in lengths:
        feed = {}
        for item in session.get_inputs():
            if "input_ids" in item.name:
                feed[item.name] = rng.integers(low, vocab, (1, length), dtype=np.int64)
            elif "attention_mask" in item.name:
                feed[item.name] = np.ones((1, length), np.int64)
            else:
                feed[item.name] = np.zeros((1, length), np.int64)
        out.append(feed)
    return out


def interleaved(
    found: dict[str, Any], feeds: list[dict[str, np.ndarray]], rounds: int, repeats: int
) -> dict[str, dict[str, Any]]:
    """Each session's largest logit difference from the first one's on ``feeds``, and its time per
    request (µs): median of ``rounds`` interleaved rounds (every session in turn, alternating direction),
    with the rounds' values."""
    first = next(iter(found.values()))
    reference = [first.run(None, f)[0] for f in feeds]
    out: dict[str, dict[str, Any]] = {}
    for name, session in found.items():
        diff = max(
            float(np.abs(session.run(None, f)[0] - r).max()) for f, r in zip(feeds, reference, strict=True)
        )
        out[name] = {"max_abs_logit_diff": diff}
    times: dict[str, list[float]] = {name: [] for name in found}
    order = list(found)
    for index in range(rounds):
        for name in order if index % 2 == 0 else order[::-1]:
            session = found[name]
            start = time.perf_counter()
            for _ in range(repeats):
                for feed in feeds:
                    session.run(None, feed)
            times[name].append((time.perf_counter() - start) / (repeats * len(feeds)) * 1e6)
    for name, values in times.items():
        out[name] |= {"us_per_request": float(np.median(values)), "rounds_us": [round(v, 1) for v in values]}
    return out


def compare(model_path: Path, threads: int, rounds: int, repeats: int, lengths: list[int]) -> dict[str, Any]:
    """Each variant's largest logit difference from the stored file, and its time per request."""
    import onnx

    model = onnx.load(str(model_path))
    found = sessions(model_path, model, threads)
    feeds = requests(found["as stored"], lengths, vocab_size(model))
    variants = interleaved(found, feeds, rounds, repeats)
    return {"model": model_path.name, "threads": threads, "lengths": lengths, "variants": variants}


def report(result: dict[str, Any], out: Path | None) -> None:
    """Print each variant's time and logit difference; write ``result`` as JSON to ``out`` if given."""
    for name, v in result["variants"].items():
        print(
            f"{name:24s} {v['us_per_request']:8.1f} µs/request (rounds {min(v['rounds_us']):.0f}-"
            f"{max(v['rounds_us']):.0f}), max |logit diff| {v['max_abs_logit_diff']:.2e}"
        )
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "artifact", type=Path, help="an int4-table ONNX int8 artifact folder (or its model.onnx)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=100, help="requests of each length per round")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 24, 32])
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args()
    model = args.artifact / "model.onnx" if args.artifact.is_dir() else args.artifact
    if not model.is_file():
        raise SystemExit(f"{model}: no such ONNX file; pass an artifact folder holding model.onnx")
    result = compare(model, args.threads, args.rounds, args.repeats, args.lengths)
    report(result, args.out)


if __name__ == "__main__":
    main()
