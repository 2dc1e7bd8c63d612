"""TFLite export with litert-torch: int32 inputs, batch 1, one signature per fixed sequence length.

Mobile runtimes and GPU delegates want static shapes and reject int64, so each length in the
target profile becomes its own signature (``seq_64``, ``seq_128``) over the same weights; the app
pads to the smallest length that fits.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import platform
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from compress.errors import ExportError
from compress.export import INPUT_ORDER, SAMPLE_TEXTS, Classifier, conversion_error, encode_batch
from compress.export.artifact import MODEL_FILES, finish_artifact
from compress.export.check import check_cases, compare_outputs, torch_reference
from compress.io import atomic_dir
from compress.share.model import sharing_spec
from compress.targets import TargetProfile

log = logging.getLogger(__name__)


def signature_name(length: int) -> str:
    return f"seq_{length}"


def convert_to_tflite(module: Classifier, path: Path, lengths: list[int], pad_id: int = 0) -> None:
    """Convert one signature per length (batch 1, int32 inputs) into a single .tflite file."""
    import litert_torch
    import torch

    converter = litert_torch.Converter()
    for length in lengths:
        sample = {name: torch.full((1, length), pad_id, dtype=torch.int32) for name in module.names}
        sample["attention_mask"][:, : max(2, length // 2)] = 1
        converter.signature(signature_name(length), module, sample_kwargs=sample)
    try:
        converter.convert(strict_export=False).export(str(path))
    except Exception as exc:
        raise conversion_error("tflite", exc) from None


@contextmanager
def replaced_forwards(replacements: list[tuple[Any, Callable[..., Any]]]) -> Iterator[None]:
    """Give each module its replacement ``forward`` (an instance attribute) while tracing; on exit every
    module has the ``forward`` it had before, an instance one included."""
    missing = object()
    saved = [(module, module.__dict__.get("forward", missing)) for module, _ in replacements]
    try:
        for module, forward in replacements:
            module.forward = forward
        yield
    finally:
        for module, before in saved:
            if before is missing:
                module.__dict__.pop("forward", None)
            else:
                module.forward = before


@contextmanager
def unfolded_layer_norms(model: Any) -> Iterator[None]:
    """Trace each LayerNorm as an unscaled normalisation followed by its scale and shift.

    The same arithmetic, but the TFLite converter no longer multiplies a LayerNorm's scale into the
    weights of the projections that read it. That fold is free for an ordinary model; in a shared
    one the tied query/key/value weights read two LayerNorms (the embeddings' in the first layer, the
    shared output LayerNorm after it), so the fold stores them twice (litert-torch 0.10). Only plain
    ``torch.nn.LayerNorm`` modules are traced this way (a subclass with its own ``forward`` computes
    something else); whatever ``forward`` an instance had is put back on exit.
    """
    import torch
    import torch.nn.functional as F

    norms = [m for m in model.modules() if type(m).forward is torch.nn.LayerNorm.forward]

    def unscaled(norm: torch.nn.LayerNorm) -> Callable[[torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor) -> torch.Tensor:
            out = F.layer_norm(x, norm.normalized_shape, None, None, norm.eps)
            if norm.weight is not None:
                out = out * norm.weight
            return out if norm.bias is None else out + norm.bias

        return forward

    with replaced_forwards([(norm, unscaled(norm)) for norm in norms]):
        yield


def buffer_stats(path: Path) -> dict[str, int]:
    """Bytes held in constant buffers, and bytes held more than once (should be 0: weights stored once)."""
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils

    model = tfl_flatbuffer_utils.read_model(str(path))
    seen: set[str] = set()
    total = duplicate = 0
    for buffer in model.buffers:
        data = buffer.data
        if data is None or len(data) < 64:
            continue
        size = len(data)
        digest = hashlib.sha256(np.asarray(data, dtype=np.uint8).tobytes()).hexdigest()
        total += size
        if digest in seen:
            duplicate += size
        seen.add(digest)
    return {"buffer_bytes": total, "duplicate_buffer_bytes": duplicate}


MISSING_OP = re.compile(
    r"Didn't find (?:op for builtin opcode|custom op for name) '([^']+)'(?: version '(\d+)')?"
)
"""How a TFLite interpreter says it has no kernel for an op (or that version of it) when it loads a model."""


def tflite_ops(path: Path) -> list[dict[str, Any]]:
    """Every op and op version the model's operators use, read from the flatbuffer with LiteRT's schema.

    This is what a runtime must register to load the file: an op version newer than its kernels is
    the usual reason an older interpreter refuses a model. Custom ops are named ``CUSTOM:<name>``.
    """
    from ai_edge_litert import schema_py_generated as schema

    data = path.read_bytes()
    if not schema.Model.ModelBufferHasIdentifier(data, 0):
        raise ExportError(f"{path}: not a TFLite flatbuffer (no TFL3 identifier); export it again")
    model = schema.Model.GetRootAs(data, 0)
    names = {code: name for name, code in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    used = {
        model.Subgraphs(s).Operators(o).OpcodeIndex()
        for s in range(model.SubgraphsLength())
        for o in range(model.Subgraphs(s).OperatorsLength())
    }
    ops = set()
    for index in used:
        code = model.OperatorCodes(index)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        name = names.get(builtin, f"BUILTIN_{builtin}")
        if name == "CUSTOM":
            name = f"CUSTOM:{(code.CustomCode() or b'').decode('utf-8', 'replace')}"
        ops.add((name, int(code.Version())))
    return [{"op": name, "version": version} for name, version in sorted(ops)]


def interpreter_version(module_name: str) -> str:
    from importlib import metadata

    distribution = module_name.replace("_", "-")
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def check_loads(path: Path, interpreters: list[str], target: str) -> list[dict[str, Any]]:
    """Load ``path`` in each of the target's named interpreters installed here; one line when one cannot.

    No table of op versions per runtime version ships with the installed packages, so the check is the
    load itself: an interpreter registers its kernels and refuses an op (or op version) it lacks. An
    interpreter not installed on this host is recorded as not checked here (verify-arm loads it on
    emulated aarch64).
    """
    loaded = []
    for module_name in interpreters:
        try:
            module = importlib.import_module(f"{module_name}.interpreter")
        except ImportError:
            loaded.append({"interpreter": module_name, "loaded": None, "note": "not installed on this host"})
            continue
        version = interpreter_version(module_name)
        try:
            module.Interpreter(model_path=str(path))
        except (ValueError, RuntimeError) as exc:
            text = str(exc)
            missing = MISSING_OP.search(text)
            if missing is None:
                reason = (text.strip().splitlines() or [type(exc).__name__])[0][:160]
                raise ExportError(
                    f"{path.name}: {module_name} {version}, a runtime target '{target}' names, cannot "
                    f"load it ({reason}); export it again or drop the interpreter from the target profile"
                ) from None
            op = f"op {missing.group(1)}" + (f" version {missing.group(2)}" if missing.group(2) else "")
            raise ExportError(
                f"{path.name}: {op} cannot run on {module_name} {version}, a runtime target '{target}' "
                "names; keep that op out of the model (another scheme, or float_layers for the layers "
                "that use it) or drop the interpreter from the target profile"
            ) from None
        loaded.append(
            {"interpreter": module_name, "version": version, "machine": platform.machine(), "loaded": True}
        )
    return loaded


def runtime_contract(path: Path, interpreters: list[str], target: str) -> dict[str, Any]:
    """The manifest's ``runtime``: the ops the file needs and which interpreters loaded it at export."""
    return {"ops": tflite_ops(path), "loaded_at_export": check_loads(path, interpreters, target)}


def tflite_runners(path: Path, threads: int = 1) -> dict[int, Callable[[dict[str, np.ndarray]], np.ndarray]]:
    """One callable per fixed length: numpy feeds -> logits, through the LiteRT interpreter."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), num_threads=threads)
    runners = {}
    for key in interpreter.get_signature_list():
        runner = interpreter.get_signature_runner(key)
        details = runner.get_input_details()
        length = int(details["input_ids"]["shape"][1])

        def run(feeds: dict[str, np.ndarray], runner: Any = runner, details: dict = details) -> np.ndarray:
            inputs = {k: np.asarray(feeds[k]).astype(d["dtype"]) for k, d in details.items()}
            return runner(**inputs)["logits"]

        runners[length] = run
    return runners


def signature_inputs(path: Path) -> list[dict[str, Any]]:
    """The manifest's ``inputs`` (from the longest signature; every signature has the same names/dtypes)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    keys = interpreter.get_signature_list()
    longest = max(keys, key=lambda k: int(k.rsplit("_", 1)[-1]))
    details = interpreter.get_signature_runner(longest).get_input_details()
    return [
        {"name": name, "dtype": np.dtype(d["dtype"]).name, "shape": [int(x) for x in d["shape"]]}
        for name, d in sorted(details.items(), key=lambda kv: INPUT_ORDER.index(kv[0]))
    ]


@contextmanager
def positions_from_mask(module: Classifier) -> Iterator[None]:
    """Trace the position lookup as a lookup at run time, indexed by ``cumsum(attention_mask) - 1``.

    With fixed-length signatures the converter folds ``position_table[arange(L)]`` into a float
    ``[1, L, H]`` constant per signature, an ADD operand that no int8 scheme of ai-edge-quantizer
    covers (196 KB of float32 per 128-token signature at H=384). Looked up at run time, the table is
    stored once and int8 like the word table. On a right-padded row (the runner pads right) the two
    index every real token alike; pad positions differ, and only feed masked keys. Only absolute
    tables (no ``padding_idx``: BERT, DistilBERT, ELECTRA) are patched: RoBERTa-style tables already
    compute positions from the input ids at run time.
    """
    import torch
    import torch.nn.functional as F

    embeddings = getattr(getattr(module.model, "base_model", None), "embeddings", None)
    table = getattr(embeddings, "position_embeddings", None)
    if type(table) is not torch.nn.Embedding or table.padding_idx is not None:
        yield
        return
    mask: dict[str, torch.Tensor] = {}
    wrapped = module.forward

    def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor, **rest: Any) -> Any:
        mask["now"] = attention_mask
        return wrapped(input_ids, attention_mask, **rest)

    def lookup(ids: torch.Tensor) -> torch.Tensor:
        positions = (mask["now"].long().cumsum(1) - 1).clamp(min=0)
        return F.embedding(positions, table.weight)

    with replaced_forwards([(module, forward), (table, lookup)]):
        yield


@contextmanager
def first_token_last_layer(module: Classifier, tokenizer: Any) -> Iterator[dict[str, Any]]:
    """Trace the last layer after its attention on token 0 alone, when the head reads that row alone.

    The TFLite counterpart of the ONNX export's ``first_token_only``: BERT's pooler reads position 0
    of the last layer, whose attention needs every token but whose output projection, feed-forward
    block and norms compute each row on its own. BERT-like layers (``attention.output(hidden,
    residual)``) get both inputs of that output block sliced to the first position. Applied only when
    the block belongs to the last layer alone (not tied to another position) and the patched model
    gives the same logits on padded sample inputs; the record (put in the export check) says which.
    """
    import torch

    layers = getattr(getattr(getattr(module.model, "base_model", None), "encoder", None), "layer", None)
    block = getattr(getattr(layers[-1], "attention", None), "output", None) if layers else None
    record: dict[str, Any] = {"applied": False}
    if block is None or not all(hasattr(block, key) for key in ("dense", "LayerNorm")):
        record["reason"] = "not a BERT-like last layer (attention.output with dense and LayerNorm)"
        yield record
        return
    if any(getattr(getattr(layer, "attention", None), "output", None) is block for layer in layers[:-1]):
        record["reason"] = "the last layer's attention output block is tied to another layer"
        yield record
        return
    sample = encode_batch(tokenizer, SAMPLE_TEXTS, None, module.names, length=None, max_length=64)
    inputs = {name: torch.as_tensor(sample[name]) for name in module.names}
    with torch.no_grad():
        full = module(**inputs)["logits"]
    wrapped = block.forward
    with replaced_forwards([(block, lambda hidden, residual: wrapped(hidden[:, :1], residual[:, :1]))]):
        try:
            with torch.no_grad():
                narrowed = module(**inputs)["logits"]
            same = narrowed.shape == full.shape and torch.allclose(narrowed, full, atol=1e-5, rtol=1e-4)
        except Exception as exc:  # a head that reads more than one row fails on the narrowed shape
            same, reason = False, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}"
        else:
            reason = "the head reads more than the first token (the narrowed model's logits differ)"
        if same:
            record["applied"] = True
            yield record
            return
    record["reason"] = reason
    yield record


def export_tflite(
    model: Any,
    tokenizer: Any,
    out_dir: Path,
    profile: TargetProfile,
    *,
    name: str | None = None,
    texts: list[str] | None = None,
    pairs: list[str] | None = None,
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Export ``model`` as an fp32 TFLite artifact folder at ``out_dir`` for ``profile``'s fixed lengths.

    ``texts``/``pairs`` are real inputs for the export check (default: built-in sentences).
    Returns the manifest written to ``out_dir/manifest.json``.
    """
    if profile.format != "tflite":
        raise ExportError(f"target '{profile.name}' wants {profile.format}, not tflite")
    module = Classifier(model.eval(), additive_mask=True).eval()
    lengths = sorted(profile.sequence_lengths)
    with atomic_dir(out_dir) as folder:
        path = folder / MODEL_FILES["tflite"]
        norms = unfolded_layer_norms(model) if sharing_spec(model) else nullcontext()
        with positions_from_mask(module), norms, first_token_last_layer(module, tokenizer) as first_token:
            convert_to_tflite(module, path, lengths, pad_id=tokenizer.pad_token_id or 0)
        stats = buffer_stats(path)
        if stats["duplicate_buffer_bytes"]:
            raise ExportError(
                f"{path.name}: {stats['duplicate_buffer_bytes']} bytes of weights are stored "
                "more than once; shared weights must be stored once"
            )
        check = check_tflite(module, tokenizer, path, texts or SAMPLE_TEXTS, pairs, lengths)
        manifest = finish_artifact(
            folder,
            model=model,
            tokenizer=tokenizer,
            name=name or Path(out_dir).name,
            fmt="tflite",
            target=profile.name,
            threads=profile.threads,
            precision="fp32",
            quantization=None,
            inputs=signature_inputs(path),
            num_labels=model.config.num_labels,
            batch=1,
            max_length=max(lengths),
            sequence_lengths=lengths,
            text_pair=pairs is not None,
            source=source,
            check={**check, **stats, "first_token_only": first_token},
            runtime=runtime_contract(path, profile.interpreters, profile.name),
        )
    return manifest


def check_tflite(
    module: Classifier,
    tokenizer: Any,
    path: Path,
    texts: list[str],
    pairs: list[str] | None,
    lengths: list[int],
) -> dict[str, Any]:
    runners = tflite_runners(path)
    if sorted(runners) != lengths:
        raise ExportError(f"{path.name}: signatures for lengths {sorted(runners)}, expected {lengths}")

    def encode(
        chosen: list[str], chosen_pairs: list[str] | None, length: int | None
    ) -> dict[str, np.ndarray]:
        return encode_batch(tokenizer, chosen, chosen_pairs, module.names, length=length, max_length=length)

    cases = check_cases(texts, pairs, encode, list(lengths), batches=(1,))
    return compare_outputs(
        torch_reference(module),
        lambda f: runners[f["input_ids"].shape[1]](f),
        cases,
        what=f"{path.name} export check",
    )
