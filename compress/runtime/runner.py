"""Run a compress artifact or deploy bundle with nothing but numpy, tokenizers and an interpreter.

This one file is copied into every deploy bundle and runs on the board, so it must never import
compress, torch or transformers. compress evaluates its ONNX/TFLite artifacts through the same code,
so a number measured on the host and one measured on a Raspberry Pi come from one computation.

    python3 runner.py predict "some text" [--pair "second text"]
    python3 runner.py predict --file in.txt|in.tsv|in.jsonl --out predictions.jsonl
    python3 runner.py benchmark --out device.json
    python3 runner.py info
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import platform
import re
import stat
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

MODEL_FILES = {"tflite": "model.tflite", "onnx": "model.onnx"}
TFLITE_MODULES = {"ai_edge_litert": "ai-edge-litert", "tflite_runtime": "tflite-runtime"}
"""TFLite interpreter modules in the order the runner tries them, with their pip distributions."""
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
PAD_TOKENS = ("[PAD]", "<pad>", "<|pad|>")
ONNX_DTYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}
ARM_PARTS = {
    "0xd03": "Cortex-A53",
    "0xd04": "Cortex-A35",
    "0xd05": "Cortex-A55",
    "0xd08": "Cortex-A72",
    "0xd0b": "Cortex-A76",
    "0xd0c": "Neoverse-N1",
    "0xd40": "Neoverse-V1",
    "0xd49": "Neoverse-N2",
}
BENCHMARK_SCHEMA = "compress.device-benchmark/1"
BUNDLE_SCHEMA = "compress.bundle/1"
ARTIFACT_SCHEMA = "compress.artifact/1"
"""A bundle's manifest says the first, an artifact folder's the second (older artifact folders have no
schema key); keys added later keep the version."""
MAX_JSON_BYTES = 16 << 20
"""A bundle's manifest and labels are a few kB; a bigger file is not one compress wrote."""
MAX_INPUT_BYTES = 1 << 30
MAX_DEPTH = 32
STREAM_NAME = re.compile(r"/dev/(?:(stdout)|(stderr)|fd/(\d+))|/proc/self/fd/(\d+)")
"""Written in place whatever they point at (terminal, pipe, a shell's > file): never replaced."""


class RunnerError(Exception):
    """A problem with the bundle or the input; the message is one line naming what and the fix."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def read_regular(path: Path, limit: int, fix: str) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; a FIFO or device is never opened."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise RunnerError(f"{path}: missing; {fix}") from None
    except OSError as exc:
        raise RunnerError(f"{path}: cannot read ({exc.strerror}); {fix}") from None
    if stat.S_ISDIR(info.st_mode):
        raise RunnerError(f"{path}: is a folder, expected a file; {fix}")
    if not stat.S_ISREG(info.st_mode):
        raise RunnerError(f"{path}: not a regular file (a FIFO or device); save the content to a file")
    if info.st_size > limit:
        raise RunnerError(f"{path}: {info.st_size} bytes, more than the {limit} this runner reads; {fix}")
    try:
        with open(path, "rb") as handle:
            return handle.read(limit + 1)[:limit]
    except OSError as exc:
        raise RunnerError(f"{path}: cannot read ({exc.strerror}); {fix}") from None


def json_depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def read_json_file(path: Path, fix: str) -> Any:
    """A small JSON file compress wrote, checked for size, encoding, syntax and nesting."""
    raw = read_regular(path, MAX_JSON_BYTES, fix)
    try:
        value = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).splitlines()[0][:80]
        raise RunnerError(f"{path}: not valid JSON ({reason}); {fix}") from None
    if json_depth(value) > MAX_DEPTH:
        raise RunnerError(f"{path}: JSON nested deeper than {MAX_DEPTH} levels; {fix}")
    return value


def inside(rel: Any) -> bool:
    """Whether a manifest path names a file inside the bundle folder."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        return False
    parts = Path(rel).parts
    return not Path(rel).is_absolute() and ".." not in parts and bool(parts)


def check_manifest(path: Path, manifest: Any) -> dict[str, Any]:
    """The keys the runner uses, with their types: format, files [{path, sha256}], max_length."""
    fix = "re-create the bundle with compress"
    if not isinstance(manifest, dict):
        raise RunnerError(f"{path}: must be a JSON object; {fix}")
    schema = manifest.get("schema")
    if schema is not None and schema not in (BUNDLE_SCHEMA, ARTIFACT_SCHEMA):
        raise RunnerError(
            f"{path}: schema {schema!r} is not {BUNDLE_SCHEMA!r} or {ARTIFACT_SCHEMA!r}; "
            "use the runner.py inside that bundle or the compress that wrote the artifact"
        )
    if manifest.get("format") not in ("onnx", "tflite") or not isinstance(manifest.get("files"), list):
        raise RunnerError(f"{path}: needs 'format' (onnx|tflite) and 'files'; {fix}")
    for index, entry in enumerate(manifest["files"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise RunnerError(f"{path}: files[{index}] needs 'path' and 'sha256' strings; {fix}")
        if not inside(entry.get("path")):
            raise RunnerError(
                f"{path}: file path {entry.get('path')!r} leaves the folder; refusing it; {fix}"
            )
    length = manifest.get("max_length")
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise RunnerError(f"{path}: needs a positive integer 'max_length'; {fix}")
    threads = manifest.get("threads")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise RunnerError(f"{path}: 'threads' must be a positive integer; {fix}")
    if not isinstance(manifest.get("task") or {}, dict):
        raise RunnerError(f"{path}: 'task' must be an object; {fix}")
    check_fallbacks(path, manifest, fix)
    return manifest


def check_fallbacks(path: Path, manifest: dict[str, Any], fix: str) -> None:
    """``fallbacks``: second .tflite models, each a listed file (so its sha256 is checked) for one
    interpreter below one version."""
    fallbacks = manifest.get("fallbacks", [])
    if not isinstance(fallbacks, list) or (fallbacks and manifest["format"] != "tflite"):
        raise RunnerError(f"{path}: 'fallbacks' must be a list, and only a TFLite model has them; {fix}")
    listed = {entry.get("path") for entry in manifest["files"]}
    for index, entry in enumerate(fallbacks):
        where = f"{path}: fallbacks[{index}]"
        if not isinstance(entry, dict):
            raise RunnerError(f"{where} must be an object; {fix}")
        rel = entry.get("path")
        if not inside(rel) or not str(rel).endswith(".tflite"):
            raise RunnerError(
                f"{where}: model path {rel!r} is not a .tflite file inside the folder; refusing it"
            )
        if rel not in listed:
            raise RunnerError(f"{where}: {rel!r} is not listed in 'files' (no sha256 to check); {fix}")
        if entry.get("interpreter") not in TFLITE_MODULES:
            raise RunnerError(f"{where}: 'interpreter' must be one of {list(TFLITE_MODULES)}; {fix}")
        if not isinstance(entry.get("below"), str) or version_tuple(entry["below"]) is None:
            raise RunnerError(f"{where}: 'below' must be a version such as \"2.15\"; {fix}")


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / "manifest.json"
    fix = "an artifact or bundle folder needs its manifest.json; copy or re-create the bundle"
    return check_manifest(path, read_json_file(path, fix))


def verify_files(folder: Path, manifest: dict[str, Any]) -> None:
    """Check the sha256 of every listed file before anything is loaded, so a modified model never runs."""
    listed = {entry["path"]: entry["sha256"] for entry in manifest["files"]}
    for name in (MODEL_FILES[manifest["format"]], "tokenizer.json", "labels.json"):
        if name not in listed:
            raise RunnerError(f"{folder / 'manifest.json'}: does not list {name}; re-create the bundle")
    for rel, expected in listed.items():
        path = folder / rel
        if not inside(rel) or not path.resolve().is_relative_to(folder.resolve()):
            raise RunnerError(f"{folder / 'manifest.json'}: file path {rel!r} leaves the folder; refusing it")
        if not path.is_file():
            raise RunnerError(f"{path}: listed in manifest.json but missing; copy the whole bundle again")
        if sha256_file(path) != expected:
            raise RunnerError(
                f"{path}: sha256 differs from manifest.json (modified or corrupted); copy it again"
            )


def check_text(text: Any, where: str) -> str:
    if not isinstance(text, str):
        raise RunnerError(f"{where}: expected text, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RunnerError(f"{where}: text is not valid UTF-8; convert it (e.g. iconv -t UTF-8)") from None
    if not text.strip():
        raise RunnerError(f"{where}: empty text; every input needs at least one non-space character")
    return text


def package_version(distribution: str, module_name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return str(getattr(sys.modules.get(module_name), "__version__", "unknown"))


def version_tuple(version: str) -> tuple[int, ...] | None:
    """The leading release numbers of a version string ("2.14.0rc1" -> (2, 14, 0)); None if it has none."""
    match = re.match(r"[0-9]+(?:\.[0-9]+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else None


def printable(text: str) -> str:
    return "".join(c for c in text if c.isprintable())


def choose_model(manifest: dict[str, Any], interpreter: str, version: str) -> tuple[str, str]:
    """The model file this interpreter runs correctly, and why: a fallback whose interpreter this is and
    whose ``below`` this version is under (an unreadable version takes the fallback too), else the primary."""
    found = version_tuple(version)
    for entry in manifest.get("fallbacks", []):
        if entry["interpreter"] == interpreter and (found is None or found < version_tuple(entry["below"])):
            scheme = f"{entry['scheme']} " if isinstance(entry.get("scheme"), str) else ""
            # the manifest's own words reach the terminal: printable characters only (no escapes)
            reason = printable(str(entry.get("reason") or "see manifest.json"))
            return entry["path"], (
                f"its {printable(scheme)}model for {interpreter} < {entry['below']}, "
                f"not {MODEL_FILES['tflite']}: {reason.strip()}"
            )
    quantization = manifest.get("quantization") if isinstance(manifest.get("quantization"), dict) else {}
    what = " ".join(str(quantization[k]) for k in ("scheme", "granularity") if quantization.get(k))
    named = primary_interpreters(manifest)
    unmade = (
        f"; WARNING: made for {', '.join(named)}, not {interpreter}, whose labels may be wrong "
        f"(pip install {TFLITE_MODULES[named[0]]})"
        if named and interpreter not in named
        else ""
    )
    return MODEL_FILES[manifest["format"]], f"its primary model{f' ({what})' if what else ''}{unmade}"


def primary_interpreters(manifest: dict[str, Any]) -> list[str]:
    """The TFLite interpreters the manifest's runtime contract names for the primary model (the target's,
    less those sent to a fallback); none when it has no contract (older artifacts) or names another kind."""
    runtime = manifest.get("runtime")
    loaded = runtime.get("loaded_at_export") if isinstance(runtime, dict) else None
    names = (
        [entry.get("interpreter") for entry in loaded if isinstance(entry, dict)]
        if isinstance(loaded, list)
        else []
    )
    return [name for name in TFLITE_MODULES if name in names]


def tflite_interpreter() -> tuple[Any, str, str]:
    """The Interpreter class: ai_edge_litert (current LiteRT) first, tflite_runtime 2.14 on older boards."""
    reasons = []
    for module_name, distribution in TFLITE_MODULES.items():
        try:
            module = importlib.import_module(f"{module_name}.interpreter")
        except ImportError as exc:
            reasons.append(f"{module_name}: {exc}")
            continue
        return module.Interpreter, module_name, package_version(distribution, module_name)
    raise RunnerError(
        "running model.tflite needs a TFLite interpreter: pip install ai-edge-litert "
        f"(or: pip install tflite-runtime==2.14.0 'numpy<2'); tried {'; '.join(reasons)}"
    )


def check_input_names(model: Path, names: list[str]) -> None:
    if "input_ids" not in names or not set(names) <= set(INPUT_NAMES):
        raise RunnerError(
            f"{model}: inputs {sorted(names)} are not {list(INPUT_NAMES)}; re-export it with compress"
        )


def pick_output(model: Path, names: list[str]) -> str:
    """The output named ``logits``, or the only output of a model exported without names."""
    if "logits" in names:
        return "logits"
    if len(names) == 1:
        return names[0]
    raise RunnerError(f"{model}: outputs {names} have no 'logits'; re-export it with compress")


class TFLiteSession:
    """One signature per fixed sequence length; inputs have fixed shapes, usually int32 and batch 1."""

    def __init__(self, model: Path, threads: int, found: tuple[Any, str, str] | None = None):
        interpreter_cls, self.interpreter, self.interpreter_version = found or tflite_interpreter()
        self.threads = threads
        try:
            interpreter = interpreter_cls(model_path=str(model), num_threads=threads)
        except (ValueError, RuntimeError) as exc:
            reason = str(exc).strip().splitlines()[0]
            raise RunnerError(
                f"{model}: {self.interpreter} {self.interpreter_version} cannot load it ({reason}); "
                "install a newer interpreter (pip install ai-edge-litert) or re-export for this one"
            ) from None
        self._by_length: dict[int, tuple[Any, dict[str, Any], str]] = {}
        batches = set()
        for key in sorted(interpreter.get_signature_list()):
            runner = interpreter.get_signature_runner(key)
            details = runner.get_input_details()
            check_input_names(model, list(details))
            batch, length = (int(d) for d in details["input_ids"]["shape_signature"])
            if length <= 0:
                raise RunnerError(f"{model}: signature {key!r} has no fixed sequence length; re-export it")
            output = pick_output(model, list(runner.get_output_details()))
            self._by_length[length] = (runner, {n: d["dtype"] for n, d in details.items()}, output)
            batches.add(batch)
        if not self._by_length:
            raise RunnerError(f"{model}: has no signatures; re-export it with compress")
        if len(batches) != 1:
            raise RunnerError(
                f"{model}: signatures disagree on the batch size {sorted(batches)}; re-export it"
            )
        self.lengths: list[int] | None = sorted(self._by_length)
        self.fixed_batch: int | None = batches.pop() if min(batches) > 0 else None

    def input_dtypes(self, length: int) -> dict[str, Any]:
        return self._by_length[length][1]

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        runner, _, output = self._by_length[feeds["input_ids"].shape[1]]
        return np.asarray(runner(**feeds)[output], dtype=np.float32)


class OnnxSession:
    """onnxruntime on the CPU; batch and sequence axes may be dynamic, dtypes come from the model.

    ``profile``: a file prefix for ONNX Runtime's profiler (one event per kernel call, which slows every
    call: for finding where the time goes, never for timing); ``end_profiling`` returns the trace's path."""

    def __init__(self, model: Path, threads: int, profile: str | None = None):
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise RunnerError(
                f"running model.onnx needs onnxruntime: pip install onnxruntime ({exc})"
            ) from None
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads = threads
        options.inter_op_num_threads = 1
        if profile:
            options.enable_profiling = True
            options.profile_file_prefix = profile
        try:
            self._session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own pybind types (InvalidProtobuf, Fail, ...)
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise RunnerError(
                f"{model}: onnxruntime {ort.__version__} cannot load it ({reason}); the file is corrupt "
                "or needs a newer onnxruntime: copy the bundle again or pip install -U onnxruntime"
            ) from None
        self.interpreter, self.interpreter_version = "onnxruntime", ort.__version__
        inputs = {i.name: i for i in self._session.get_inputs()}
        check_input_names(model, list(inputs))
        unknown = {i.type for i in inputs.values()} - set(ONNX_DTYPES)
        if unknown:
            raise RunnerError(f"{model}: input types {sorted(unknown)} are not int32/int64; re-export it")
        self._dtypes = {name: ONNX_DTYPES[i.type] for name, i in inputs.items()}
        batch, length = inputs["input_ids"].shape
        self.fixed_batch: int | None = batch if isinstance(batch, int) and batch > 0 else None
        self.lengths: list[int] | None = [length] if isinstance(length, int) and length > 0 else None
        self._output = pick_output(model, [o.name for o in self._session.get_outputs()])

    def input_dtypes(self, length: int) -> dict[str, Any]:
        return self._dtypes

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(self._session.run([self._output], feeds)[0], dtype=np.float32)

    def end_profiling(self) -> str:
        return self._session.end_profiling()


class Encoder:
    """The artifact's own tokenizer.json, truncating to its max_length (the model never saw longer)."""

    def __init__(self, path: Path, max_length: int):
        from tokenizers import Tokenizer

        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception subclass for any parse error
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise RunnerError(
                f"{path}: cannot load the tokenizer ({reason}); copy the bundle again"
            ) from None
        padding = self.tokenizer.padding
        known = [self.tokenizer.token_to_id(token) for token in PAD_TOKENS]
        self.pad_id = padding["pad_id"] if padding else next((i for i in known if i is not None), 0)
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length)
        self.max_length = max_length

    def encode(self, texts: list[str], pairs: list[str] | None) -> list[tuple[list[int], list[int]]]:
        if len(texts) == 1 and (pairs is None or len(pairs) == 1):
            # one request: encode_batch hands even a single text to its thread pool, which costs more
            # than tokenising it here
            e = self.tokenizer.encode(texts[0], None if pairs is None else pairs[0])
            return [(e.ids, e.type_ids)]
        inputs: list[Any] = texts if pairs is None else list(zip(texts, pairs, strict=True))
        return [(e.ids, e.type_ids) for e in self.tokenizer.encode_batch(inputs)]


def token_limit(max_length: int, lengths: list[int] | None) -> int:
    """Where the tokenizer truncates: the manifest's max_length, or the longest signature if shorter."""
    return min(max_length, max(lengths or [max_length]))


def length_for(lengths: list[int] | None, tokens: int) -> int:
    """The sequence length a row of ``tokens`` runs at: dynamic models (no fixed lengths) take the
    batch's own length, fixed ones the smallest signature that holds it."""
    return tokens if lengths is None else next(n for n in lengths if n >= tokens)


def make_feeds(encoded: list[tuple[list[int], list[int]]], length: int, pad_id: int, dtypes: dict[str, Any]):
    ids = np.full((len(encoded), length), pad_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for row, (tokens, type_ids) in enumerate(encoded):
        ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = 1
        types[row, : len(tokens)] = type_ids
    arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return {name: arrays[name].astype(dtype) for name, dtype in dtypes.items()}


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def percentile_summary(samples_ms: list[float]) -> dict[str, float]:
    values = np.asarray(samples_ms, dtype=np.float64)
    summary = {f"p{q}": float(np.percentile(values, q)) for q in (50, 90, 99)}
    summary.update(mean=float(values.mean()), min=float(values.min()), max=float(values.max()))
    return {key: round(value, 4) for key, value in summary.items()}


def cpu_model() -> str:
    """The CPU name: x86 'model name', or an ARM core named from 'CPU part' (a Pi 4 reports only 0xd08)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or "unknown"
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    if "model name" in fields:
        return fields["model name"]
    part = fields.get("cpu part", "").lower()
    if part:
        return ARM_PARTS.get(part, f"ARM CPU part {part}")
    return fields.get("hardware") or platform.processor() or "unknown"


def device_info() -> dict[str, Any]:
    board = Path("/proc/device-tree/model")
    return {
        "machine": platform.machine(),
        "system": platform.system(),
        "release": platform.release(),
        "cpu_model": cpu_model(),
        "board": board.read_text(errors="replace").strip("\x00\n ") if board.is_file() else None,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


class Runner:
    """A verified artifact ready to predict: its tokenizer, label names and one interpreter session."""

    def __init__(
        self,
        folder: Path,
        manifest: dict[str, Any],
        session: Any,
        encoder: Encoder,
        labels: list[str],
        model: str | None = None,
        why: str = "its primary model",
    ):
        self.folder, self.manifest, self.session, self.encoder = folder, manifest, session, encoder
        self.labels = labels
        self.model = folder / (model or MODEL_FILES[manifest["format"]])
        self.why = why
        """Why this model file runs: the primary, or the fallback for this interpreter (and the reason)."""
        self.threads: int = session.threads
        self.text_pair = bool((manifest.get("task") or {}).get("text_pair", False))

    def _inputs(self, texts: Any, pairs: Any) -> tuple[list[str], list[str] | None]:
        texts = [texts] if isinstance(texts, str) else list(texts)
        checked = [check_text(text, f"text {i + 1}") for i, text in enumerate(texts)]
        if pairs is None:
            if self.text_pair:
                raise RunnerError(
                    "this model classifies text pairs; give a second text (--pair or a TSV column)"
                )
            return checked, None
        if not self.text_pair:
            raise RunnerError("this model classifies single texts; drop the second text (--pair)")
        pairs = [pairs] if isinstance(pairs, str) else list(pairs)
        if len(pairs) != len(checked):
            raise RunnerError(f"{len(checked)} texts but {len(pairs)} pairs; give one pair per text")
        return checked, [check_text(pair, f"pair {i + 1}") for i, pair in enumerate(pairs)]

    def _length_for(self, tokens: int) -> int:
        return length_for(self.session.lengths, tokens)

    def _run(self, chunk: list[tuple[list[int], list[int]]], step: int) -> np.ndarray:
        length = self._length_for(max(len(ids) for ids, _ in chunk))
        rows = chunk + [chunk[-1]] * (step - len(chunk)) if self.session.fixed_batch else chunk
        logits = self.session.run(
            make_feeds(rows, length, self.encoder.pad_id, self.session.input_dtypes(length))
        )
        if logits.ndim != 2 or logits.shape[1] != len(self.labels):
            raise RunnerError(
                f"{self.model}: logits of shape {list(logits.shape)} do not match {len(self.labels)} labels "
                "in labels.json; re-create the bundle"
            )
        return logits[: len(chunk)]

    def predict_logits(self, texts: Any, pairs: Any = None, batch_size: int = 1) -> np.ndarray:
        texts, pairs = self._inputs(texts, pairs)
        encoded = self.encoder.encode(texts, pairs)
        step = self.session.fixed_batch or max(1, batch_size)
        chunks = [self._run(encoded[start : start + step], step) for start in range(0, len(encoded), step)]
        return np.concatenate(chunks) if chunks else np.zeros((0, len(self.labels)), dtype=np.float32)

    def decode(self, logits: np.ndarray) -> list[dict[str, Any]]:
        probabilities = softmax(logits)
        best = probabilities.argmax(axis=1)
        return [
            {"label": self.labels[i], "score": float(row[i])}
            for i, row in zip(best, probabilities, strict=True)
        ]

    def predict(self, texts: Any, pairs: Any = None, batch_size: int = 1) -> list[dict[str, Any]]:
        return self.decode(self.predict_logits(texts, pairs, batch_size))

    def describe(self) -> dict[str, Any]:
        keys = ("name", "kind", "target", "format", "precision", "max_length")
        return {
            **{key: self.manifest.get(key) for key in keys},
            "sequence_lengths": self.session.lengths,
            "labels": self.labels,
            "text_pair": self.text_pair,
            "model": self.model.relative_to(self.folder).as_posix(),
            "model_sha256": sha256_file(self.model),
            "model_bytes": self.model.stat().st_size,
            "interpreter": {"name": self.session.interpreter, "version": self.session.interpreter_version},
            "threads": self.threads,
        }

    def benchmark(self, texts: Any, warmup: int = 10, runs: int = 100, pairs: Any = None) -> dict[str, Any]:
        """Latency of one text per call, tokenization included: what an application on the device waits."""
        texts, pairs = self._inputs(texts, pairs)
        if runs < 1 or warmup < 0:
            raise RunnerError(f"runs={runs}, warmup={warmup}: need runs >= 1 and warmup >= 0")
        samples = []
        for i in range(warmup + runs):
            pair = None if pairs is None else [pairs[i % len(pairs)]]
            start = time.perf_counter()
            self.predict_logits([texts[i % len(texts)]], pair)
            if i >= warmup:
                samples.append((time.perf_counter() - start) * 1000.0)
        tokens = [len(ids) for ids, _ in self.encoder.encode(texts, pairs)]
        described = self.describe()
        return {
            "schema": BENCHMARK_SCHEMA,
            "artifact": described.pop("name"),
            **{
                key: described[key]
                for key in ("target", "format", "precision", "model", "model_sha256", "model_bytes")
            },
            "interpreter": described["interpreter"],
            "threads": self.threads,
            "batch_size": 1,
            "input_tokens": {
                "min": min(tokens),
                "max": max(tokens),
                "mean": round(sum(tokens) / len(tokens), 2),
            },
            "padded_to": sorted({self._length_for(n) for n in tokens}) if self.session.lengths else None,
            "warmup": warmup,
            "runs": runs,
            "latency_ms": percentile_summary(samples),
            "device": device_info(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }


def read_labels(path: Path) -> list[str]:
    labels = read_json_file(path, "copy or re-create the bundle")
    if not isinstance(labels, list) or not labels or not all(isinstance(label, str) for label in labels):
        raise RunnerError(f"{path}: must be a JSON list of label names in id order")
    if len(set(labels)) != len(labels):
        raise RunnerError(f"{path}: a label name is listed twice; re-create the bundle")
    return labels


def load(
    artifact_dir: str | Path, *, verify: bool = True, threads: int | None = None, model: str | None = None
) -> Runner:
    """Open an artifact or bundle folder; with verify, every file's sha256 is checked before loading.

    A TFLite folder may hold a fallback model for an interpreter that computes the primary one wrongly
    (manifest ``fallbacks``); the installed interpreter picks its model unless ``model`` names one."""
    folder = Path(artifact_dir)
    manifest = read_manifest(folder)
    if verify:
        verify_files(folder, manifest)
    labels = read_labels(folder / "labels.json")
    if threads is not None and threads < 1:
        raise RunnerError(f"--threads {threads}: give a positive number of interpreter threads")
    count = int(threads or manifest.get("threads") or os.cpu_count() or 1)
    primary = MODEL_FILES[manifest["format"]]
    known = [primary, *(entry["path"] for entry in manifest.get("fallbacks", []))]
    if model is not None and model not in known:
        raise RunnerError(f"{folder / 'manifest.json'}: no model {model!r}; it lists {known}")
    if manifest["format"] == "tflite":
        found = tflite_interpreter()
        chosen, why = choose_model(manifest, found[1], found[2])
        if model is not None and model != chosen:
            chosen, why = model, "the model asked for"
        path = folder / chosen
        if not path.is_file():
            raise RunnerError(f"{path}: missing; copy the whole bundle again")
        session: Any = TFLiteSession(path, count, found)
    else:
        chosen, why, path = primary, "its primary model", folder / primary
        if not path.is_file():
            raise RunnerError(f"{path}: missing; copy the whole bundle again")
        session = OnnxSession(path, count)
    encoder = Encoder(folder / "tokenizer.json", token_limit(manifest["max_length"], session.lengths))
    return Runner(folder, manifest, session, encoder, labels, chosen, why)


def read_inputs(path: Path) -> tuple[list[str], list[str] | None]:
    """Texts from .txt (one per line), .tsv (text[<TAB>pair]) or .jsonl ({"text", "pair"}); UTF-8 only."""
    raw = read_regular(path, MAX_INPUT_BYTES, "give a text file")
    try:
        content = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise RunnerError(f"{path}:{line}: not valid UTF-8; convert the file (e.g. iconv -t UTF-8)") from None
    lines = content.split("\n")
    if lines[-1] == "":
        lines.pop()
    texts, pairs = [], []
    for number, line in enumerate(lines, 1):
        text, pair = split_line(line.rstrip("\r"), path.suffix.lower(), f"{path}:{number}")
        texts.append(check_text(text, f"{path}:{number}"))
        pairs.append(None if pair is None else check_text(pair, f"{path}:{number} (pair)"))
    if not texts:
        raise RunnerError(f"{path}: no texts; put one text per line")
    if all(pair is None for pair in pairs):
        return texts, None
    if any(pair is None for pair in pairs):
        raise RunnerError(f"{path}: some lines have a second text and some do not; give every line a pair")
    return texts, pairs


def split_line(line: str, suffix: str, where: str) -> tuple[Any, Any]:
    if suffix == ".jsonl":
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # also a line nested past the parser's stack
            row = None
        if not isinstance(row, dict) or "text" not in row:
            raise RunnerError(f'{where}: expected a JSON object like {{"text": "...", "pair": "..."}}')
        return row["text"], row.get("pair")
    if suffix == ".tsv":
        columns = line.split("\t")
        if len(columns) > 2:
            raise RunnerError(
                f"{where}: {len(columns)} tab-separated columns; expected text or text<TAB>pair"
            )
        return columns[0], columns[1] if len(columns) == 2 else None
    return line, None


def stream_descriptor(path: Path) -> int | None:
    """The descriptor /dev/stdout, /dev/stderr, /dev/fd/N or /proc/self/fd/N stands for; None otherwise."""
    match = STREAM_NAME.fullmatch(str(path))
    if match is None:
        return None
    stdout, stderr, fd, proc_fd = match.groups()
    return 1 if stdout else 2 if stderr else int(fd or proc_fd)


def output_is_stream(path: Path) -> bool:
    """True for /dev/stdout or /dev/stderr (written in place); a regular file or nothing is replaced
    atomically; anything else (a folder, FIFO or device such as /dev/null) is refused, never replaced."""
    if stream_descriptor(path) is not None:
        return True
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise RunnerError(f"{path}: cannot write ({exc.strerror}); fix the path") from None
    if stat.S_ISREG(mode):
        return False
    what = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a FIFO or device)"
    raise RunnerError(f"{path}: is {what}; give a file path for --out, or leave --out off for stdout")


def write_text_atomic(path: Path, text: str) -> None:
    if output_is_stream(path):
        # the process's own descriptor, not a new open of the name (which would truncate a shell's
        # `> file` and write from byte 0 under the lines printed after it)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            with os.fdopen(os.dup(stream_descriptor(path)), "w", encoding="utf-8") as stream:
                stream.write(text)
        except OSError as exc:
            raise RunnerError(f"{path}: cannot write ({exc.strerror})") from None
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise RunnerError(f"{path}: cannot write ({exc.strerror})") from None


def emit(lines: list[str], out: Path | None) -> None:
    if out is None:
        sys.stdout.write("".join(line + "\n" for line in lines))
    else:
        write_text_atomic(out, "".join(line + "\n" for line in lines))


def run_predict(runner: Runner, args: argparse.Namespace) -> None:
    if (args.text is None) == (args.file is None):
        raise RunnerError(
            'predict needs either one text (predict "some text") or --file IN.txt|IN.tsv|IN.jsonl'
        )
    if args.file is None:
        emit([json.dumps(row, ensure_ascii=False) for row in runner.predict(args.text, args.pair)], args.out)
        return
    if args.pair is not None:
        raise RunnerError("--pair goes with a single text; in a file put the pair in a second TSV column")
    texts, pairs = read_inputs(args.file)
    logits = runner.predict_logits(texts, pairs, batch_size=args.batch_size)
    rows = [
        {"line": number, **row, "logits": [round(float(v), 6) for v in values]}
        for number, (row, values) in enumerate(zip(runner.decode(logits), logits, strict=True), 1)
    ]
    emit([json.dumps(row, ensure_ascii=False) for row in rows], args.out)


def run_benchmark(runner: Runner, args: argparse.Namespace) -> None:
    if args.file is None:
        texts = [" ".join(["hello"] * runner.encoder.max_length)]
        pairs = texts if runner.text_pair else None
        source = f"synthetic text truncated to max_length {runner.encoder.max_length}"
    else:
        (texts, pairs), source = read_inputs(args.file), str(args.file)
    result = {**runner.benchmark(texts, args.warmup, args.runs, pairs), "input": source}
    emit([json.dumps(result, indent=2)], args.out)
    if args.out is not None:
        latency = result["latency_ms"]
        print(f"p50 {latency['p50']:.2f} ms, p90 {latency['p90']:.2f} ms -> {args.out}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runner.py", description="Run a compress bundle on this device.")
    here = Path(__file__).resolve().parent
    parser.add_argument(
        "--dir", type=Path, default=here, help="bundle or artifact folder (default: this file's)"
    )
    parser.add_argument(
        "--threads", type=int, help="interpreter threads (default: the bundle's target, else all)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    predict = commands.add_parser("predict", help="classify one text, or a file of texts into JSON lines")
    predict.add_argument("text", nargs="?", help="the text to classify")
    predict.add_argument("--pair", help="the second text, for models that classify text pairs")
    predict.add_argument(
        "--file", type=Path, help="one text per line (.txt), text<TAB>pair (.tsv), or .jsonl"
    )
    predict.add_argument("--out", type=Path, help="write JSON lines here instead of stdout")
    predict.add_argument("--batch-size", type=int, default=1, help="texts per call when the model allows it")
    bench = commands.add_parser("benchmark", help="time predictions on this device and write JSON")
    bench.add_argument(
        "--file", type=Path, help="texts to time (default: a synthetic text of the full length)"
    )
    bench.add_argument("--warmup", type=int, default=10)
    bench.add_argument("--runs", type=int, default=100)
    bench.add_argument("--out", type=Path, help="write the JSON here (for compress report --device-results)")
    commands.add_parser("info", help="show what the bundle holds and which interpreter runs it")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        runner = load(args.dir, threads=args.threads)
        if args.command == "predict":
            run_predict(runner, args)
        elif args.command == "benchmark":
            run_benchmark(runner, args)
        else:
            print(json.dumps({**runner.describe(), "device": device_info()}, indent=2))
        # Which model ran, said once the work is done: a failure prints only its error line.
        session = runner.session
        print(
            f"runner: {session.interpreter} {session.interpreter_version} ran "
            f"{runner.model.name}, {runner.why}",
            file=sys.stderr,
        )
    except RunnerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
