"""The neural-compressor peer: the teacher through its PyTorch int8 (PT2E static) path, run by PyTorch.

neural-compressor 3.x on torch 2.13 quantizes through PT2E (torch.export + X86InductorQuantizer):
``export`` -> ``prepare(StaticQuantConfig())`` -> calibrate -> ``convert`` gives a graph of
quantize/dequantize ops around float kernels, which is slower than float until ``torch.compile``
(inductor, with freezing) fuses it into int8 kernels. That is what its documentation tells users
to do, so that is what this row measures. The program is saved with ``torch.export.save`` and
measured in a fresh process by this file's worker, which reuses compress's measurement loop
(``compress.evaluate_worker.measure``) and metric functions so the numbers mean the same as
every other row's.

Worker: ``python -m benchmarks.torch_int8 REQUEST.json RESULT.json`` (same request as
compress.evaluate_worker, ``model`` being the folder written by ``nc_static_int8``).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

PROGRAM = "model.pt2"


def _encode(
    tokenizer: Any, names: list[str], texts: list[str], pairs: list[str] | None, max_length: int
) -> tuple[Any, ...]:
    enc = tokenizer(
        texts, pairs, truncation=True, max_length=max_length, padding="longest", return_tensors="pt"
    )
    return tuple(enc[name] if name in enc else enc["input_ids"] * 0 for name in names)


def nc_static_int8(
    teacher_dir: Path,
    out_dir: Path,
    texts: list[str],
    pairs: list[str] | None,
    max_length: int,
    batch_size: int = 16,
) -> Any:
    """The teacher through neural-compressor's PT2E static int8, calibrated on ``texts`` (training rows)."""
    import torch
    from neural_compressor.torch.export import export
    from neural_compressor.torch.quantization import StaticQuantConfig, convert, prepare

    from benchmarks.peers import Built
    from compress.export import Classifier
    from compress.io import atomic_dir, file_entries, write_json_atomic
    from compress.models import label_names_of, load_classifier

    start = time.time()
    model, tokenizer = load_classifier(teacher_dir)
    module = Classifier(model.eval()).eval()
    example = _encode(tokenizer, module.names, texts[:2], pairs[:2] if pairs else None, max_length)
    batch = torch.export.Dim("batch", min=1, max=4096)
    sequence = torch.export.Dim("sequence", min=2, max=max_length)
    shapes = tuple({0: batch, 1: sequence} for _ in module.names)
    with torch.no_grad():
        prepared = prepare(export(module, example, dynamic_shapes=shapes), StaticQuantConfig())
        for lo in range(0, len(texts), batch_size):
            chunk = pairs[lo : lo + batch_size] if pairs else None
            prepared(*_encode(tokenizer, module.names, texts[lo : lo + batch_size], chunk, max_length))
        quantized = convert(prepared)
        program = torch.export.export(quantized, example, dynamic_shapes=shapes)
    with atomic_dir(out_dir) as folder:
        torch.export.save(program, str(folder / PROGRAM))
        tokenizer.save_pretrained(str(folder))
        write_json_atomic(folder / "labels.json", label_names_of(model))
        write_json_atomic(
            folder / "manifest.json",
            {
                "kind": "torch-program",
                "format": "pt2",
                "precision": "int8",
                "name": out_dir.name,
                "inputs": module.names,
                "max_length": max_length,
                "task": {"text_pair": pairs is not None},
                "quantization": {
                    "scheme": "static",
                    "granularity": "per-channel",
                    "calibration": {"rows": len(texts), "method": "minmax (StaticQuantConfig default)"},
                    "tool": "neural_compressor.torch PT2E: export, prepare(StaticQuantConfig()), convert",
                },
                "files": file_entries(folder),
            },
        )
    return Built(
        out_dir, time.time() - start, "neural_compressor.torch StaticQuantConfig (PT2E) + torch.compile"
    )


def load_program(path: str, threads: int, compile_batch: int) -> tuple[Any, dict[str, Any]]:
    """The saved program as a predict function, compiled by inductor before any timing starts.

    Both shapes the measurement uses (one sentence, a full batch) are compiled here, so neither
    the latency nor the throughput pass includes compilation; its cost is reported as compile_s.
    """
    import torch
    import torch._inductor.config as inductor_config
    import torchao.quantization.pt2e  # noqa: F401 - registers the quantized_decomposed ops the program uses
    from transformers import AutoTokenizer

    torch.set_num_threads(threads)
    inductor_config.freezing = True
    folder = Path(path)
    manifest = json.loads((folder / "manifest.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    program = torch.export.load(str(folder / PROGRAM)).module()
    compiled = torch.compile(program, dynamic=True)
    names, max_length = manifest["inputs"], manifest["max_length"]

    @torch.inference_mode()
    def predict(texts: list[str], pairs: list[str] | None) -> np.ndarray:
        return compiled(*_encode(tokenizer, names, texts, pairs, max_length))["logits"].float().numpy()

    start = time.time()
    sample = ["a short warm-up sentence for the compiler"]
    for size in (1, compile_batch):
        predict(sample * size, sample * size if manifest["task"]["text_pair"] else None)
    info = {
        "runtime": f"torch {torch.__version__} (torch.compile inductor, int8)",
        "max_length": max_length,
        "compile_s": round(time.time() - start, 2),
    }
    return predict, info


def run(request: dict[str, Any]) -> dict[str, Any]:
    from compress.evaluate_worker import measure, peak_rss_bytes

    threads = request["threads"]
    before = peak_rss_bytes()
    predict, info = load_program(request["model"], threads, request["batch_size"])
    logits, stats = measure(predict, request)
    np.save(request["logits"], logits)
    stats["latency_ms"].update(warmup=request["warmup"], threads=threads, padded_to=None)
    stats["throughput"]["runtime_batch"] = None
    return {
        **info,
        **stats,
        "peak_rss_bytes": peak_rss_bytes(),
        "rss_before_load_bytes": before,
        "machine": platform.machine(),
        "system": platform.system(),
        "threads": threads,
    }


def evaluate_program(folder: Path, split: Any, settings: Any, teacher_logits: np.ndarray) -> dict[str, Any]:
    """One report entry for the saved program, shaped like ``compress.evaluate.evaluate_subject``'s.

    Inductor's kernel cache lives beside the program, so compile_s is a cold compile, not a hit
    in a cache an earlier run left in /tmp.
    """
    from compress.evaluate import RUN_METRICS, score
    from compress.io import read_json, sha256_file
    from compress.metrics import predicted_ids

    threads = max(1, min(settings.threads or settings.teacher_threads, os.cpu_count() or 1))
    root = Path(__file__).resolve().parent.parent
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS=str(threads),
        PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p),
        TORCHINDUCTOR_CACHE_DIR=str(folder.parent / "inductor-cache"),
    )
    with tempfile.TemporaryDirectory(prefix="bench-pt2e-") as tmp:
        request = {
            "model": str(folder),
            "texts": split.texts,
            "pairs": split.pairs,
            "threads": threads,
            "warmup": settings.warmup,
            "latency_samples": settings.latency_samples,
            "batch_size": settings.batch_size,
            "logits": f"{tmp}/logits.npy",
        }
        Path(tmp, "request.json").write_text(json.dumps(request))
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.torch_int8", f"{tmp}/request.json", f"{tmp}/result.json"],
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"measuring {folder} failed:\n{proc.stderr[-4000:]}")
        result, logits = read_json(f"{tmp}/result.json"), np.load(f"{tmp}/logits.npy")
    manifest = read_json(folder / "manifest.json")
    metrics = score(logits, split, teacher_logits, settings.bootstrap_resamples)
    metrics.update({key: result[key] for key in RUN_METRICS})
    program = folder / PROGRAM
    return {
        "name": manifest["name"],
        "role": "artifact",
        "path": str(folder),
        "format": "pt2",
        "target": None,
        "precision": "int8",
        "bytes": program.stat().st_size,
        "sha256": sha256_file(program),
        "max_length": result["max_length"],
        "compile_s": result["compile_s"],
        "measured": {
            "where": "host",
            "machine": result["machine"],
            "system": result["system"],
            "runtime": result["runtime"],
            "threads": result["threads"],
        },
        "metrics": metrics,
        "predictions": predicted_ids(logits),
    }


def main(argv: list[str]) -> int:
    request_path, result_path = argv
    request = json.loads(Path(request_path).read_text())
    Path(result_path).write_text(json.dumps(run(request)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
