"""What packing each layer's query/key/value projections buys at batch 1 (issue 19).

The export stage's fused ONNX graph holds attention in one of two layouts (``export.attention``):
``separate`` (ONNX Runtime's ``MultiHeadAttention`` after three projection MatMuls, which dynamic int8
makes three ``MatMulInteger``) or ``packed`` (``Attention`` reading one packed weight, which dynamic int8
makes ``QAttention``: one int8 matmul and the attention in one kernel). This exports one checkpoint both
ways through compress's own export and quantize code (fused; dynamic int8 with the headline's int4
tables), then times the four files in interleaved rounds of batch-1 requests and compares each one's
logits with the separate int8 file's. Latency is a measurement: run it alone on the machine.

    python benchmarks/attention_layouts.py runs/benchmarks/sst2/runs/sst2-distil3/02-share \\
        --out benchmarks/results/attention_layouts_sst2.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

if not __package__:  # run as ``python benchmarks/attention_layouts.py``: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.lookup_variants import interleaved, report, requests, vocab_size

LAYOUTS = ("separate", "packed")


def build(checkpoint: Path, work: Path, embedding_bits: int) -> dict[str, Path]:
    """``<layout> fp32`` and ``<layout> int8`` model files of ``checkpoint`` for each layout."""
    from compress.export.onnx import export_onnx
    from compress.models import load_classifier
    from compress.quantize.onnx import quantize_onnx
    from compress.targets import load_target

    model, tokenizer = load_classifier(checkpoint)
    target = load_target("arm64-onnx")
    files = {}
    for layout in LAYOUTS:
        manifest = export_onnx(model, tokenizer, work / f"{layout}-fp32", target, fuse=True, attention=layout)
        if not manifest["fusion"]["applied"]:
            raise SystemExit(f"{checkpoint}: attention did not fuse ({manifest['fusion']['reason']})")
        quantize_onnx(
            work / f"{layout}-fp32", work / f"{layout}-int8", scheme="dynamic", embedding_bits=embedding_bits
        )
        files[f"{layout} int8"] = work / f"{layout}-int8" / "model.onnx"
        files[f"{layout} fp32"] = work / f"{layout}-fp32" / "model.onnx"
    return files


def compare(
    checkpoint: Path, threads: int, rounds: int, repeats: int, lengths: list[int], embedding_bits: int
) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        files = build(checkpoint, Path(tmp), embedding_bits)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        found = {
            name: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            for name, path in files.items()
        }
        feeds = requests(found["separate int8"], lengths, vocab_size(onnx.load(str(files["separate int8"]))))
        variants = interleaved(found, feeds, rounds, repeats)
        for name, path in files.items():
            variants[name]["bytes"] = path.stat().st_size
    return {
        "checkpoint": checkpoint.name,
        "threads": threads,
        "lengths": lengths,
        "embedding_bits": embedding_bits,
        "reference": "separate int8",
        "variants": variants,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a model folder (e.g. a run's share-stage checkpoint)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=50, help="requests of each length per round")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 24, 32, 48])
    parser.add_argument("--embedding-bits", type=int, choices=[4, 8], default=4)
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args()
    if not (args.checkpoint / "config.json").is_file():
        raise SystemExit(f"{args.checkpoint}: no config.json; pass a model folder")
    result = compare(
        args.checkpoint, args.threads, args.rounds, args.repeats, args.lengths, args.embedding_bits
    )
    report(result, args.out)


if __name__ == "__main__":
    main()
