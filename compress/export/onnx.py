"""ONNX export with ``torch.onnx.export(dynamo=True)``: dynamic batch and sequence axes, checked.

Shared weights (one module reused at several layer positions, a tied embedding) must be stored
once: the exporter can fold a per-use copy of a shared weight (e.g. its transpose) into separate
identical initializers, so ``dedupe_initializers`` merges initializers with the same content. The
opposite also happens: a weight read by several layers keeps a runtime ``Transpose`` in front of its
MatMuls, which hides it from int8 quantizers (they quantize MatMul weights that are initializers), so
``fold_weight_transposes`` stores such a weight pre-transposed, still once.

``fuse=True`` exports instead the graph ONNX Runtime's transformer optimizer can fuse (attention,
skip-layer-norm, bias-GELU): the TorchScript exporter tracing eager attention, which is the pattern the
optimizer matches (the dynamo exporter's attention is not). A model whose attention does not fuse in
every layer falls back to the dynamo graph, with the reason logged and kept in the manifest: the
fallback is the checked graph compress has always shipped, so a default-on speed-up never fails a run.
Two rewrites follow the fusions, both for batch-1 latency on ONNX Runtime's CPU provider and both
checked against PyTorch with the rest: ``split_skip_layer_norms`` (standard ops instead of a slow
contrib kernel) and ``first_token_only`` (the last layer after its attention on the one row the head
reads).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from compress.errors import ExportError
from compress.export import SAMPLE_TEXTS, Classifier, conversion_error, encode_batch, max_positions
from compress.export.artifact import MODEL_FILES, finish_artifact
from compress.export.check import check_cases, compare_outputs, torch_reference
from compress.io import atomic_dir
from compress.targets import TargetProfile

log = logging.getLogger(__name__)

ONNX_DTYPES = {7: "int64", 6: "int32", 1: "float32"}
SCOPES_KEY = "pkg.torch.onnx.name_scopes"


def trace_to_onnx(module: Classifier, path: Path, *, opset: int, input_dtype: str, seq_max: int) -> None:
    """Trace the wrapper with dynamic ``batch`` and ``sequence`` axes and save a single-file model."""
    import torch

    dtype = getattr(torch, input_dtype)
    example = tuple(torch.ones(2, 5, dtype=dtype) for _ in module.names)
    batch = torch.export.Dim("batch", min=1, max=4096)
    sequence = torch.export.Dim("sequence", min=1, max=seq_max)
    shapes = {name: {0: batch, 1: sequence} for name in module.names}
    try:
        program = torch.onnx.export(
            module,
            example,
            input_names=module.names,
            output_names=["logits"],
            dynamic_shapes=shapes,
            dynamo=True,
            opset_version=opset,
            verbose=False,
        )
    except Exception as exc:
        raise conversion_error("onnx", exc) from None
    program.save(str(path), external_data=False)


FUSION_TOOL = "onnxruntime.transformers.optimizer.optimize_model(model_type=bert, opt_level=0)"
ATTENTION_OPS = {"separate": "MultiHeadAttention", "packed": "Attention"}
"""The fused attention op for each ``attention`` layout of the export stage."""


@contextmanager
def eager_attention(model: Any) -> Iterator[None]:
    """Run ``model`` with transformers' eager attention (the explicit MatMul/Softmax chain), then restore."""
    before = getattr(model.config, "_attn_implementation", None)
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if before is not None:
            model.set_attn_implementation(before)


def trace_for_fusion(module: Classifier, path: Path, *, opset: int, input_dtype: str) -> None:
    """TorchScript export of eager attention, dynamic ``batch`` and ``sequence`` axes, one file."""
    import torch

    dtype = getattr(torch, input_dtype)
    example = tuple(torch.ones(2, 5, dtype=dtype) for _ in module.names)
    axes = {name: {0: "batch", 1: "sequence"} for name in module.names}
    with eager_attention(module.model):
        torch.onnx.export(
            module,
            example,
            str(path),
            input_names=module.names,
            output_names=["logits"],
            dynamic_axes={**axes, "logits": {0: "batch"}},
            opset_version=opset,
            dynamo=False,
        )


def fusion_options(attention: str) -> Any:
    """The optimizer's BERT fusions, with three choices made for what compress does after them.

    ``attention``: ``separate`` (``MultiHeadAttention``) keeps the query/key/value projections as their
    own MatMuls: static QDQ int8 has no ``Attention`` quantizer (its packed QKV weight would stay float)
    and ``float_layers`` names those projections. ``packed`` (``Attention``) reads one packed QKV weight
    per layer, which dynamic int8 turns into ONNX Runtime's ``QAttention`` (one int8 matmul and the
    attention in a single kernel instead of three ``MatMulInteger`` and a float attention).
    No ``EmbedLayerNormalization``: it swallows the
    ``Gather`` lookups that int8 and int4 (``embedding_bits: 4``) tables are stored through, and the
    export does not know which the quantize stage will pick. The raw 2-D attention mask, not a
    per-row length: the mask means what the model's mask means, whatever the padding side.
    """
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions("bert")
    options.use_multi_head_attention = attention == "separate"
    options.enable_embed_layer_norm = False
    options.use_raw_attention_mask(True)
    return options


def attention_shape(config: Any) -> tuple[int, int, int]:
    """(heads, hidden size, layers) from a BERT-like or DistilBERT-like config; 0 when it does not say."""

    def first(*keys: str) -> int:
        return next((int(getattr(config, k)) for k in keys if getattr(config, k, None)), 0)

    return (
        first("num_attention_heads", "n_heads"),
        first("hidden_size", "dim"),
        first("num_hidden_layers", "n_layers"),
    )


def fuse_graph(path: Path, config: Any, attention: str) -> tuple[dict[str, int], int, int | str]:
    """Run ORT's transformer fusions on ``path`` in place; return the fused op counts of the saved graph,
    how many ``SkipLayerNormalization`` ops were split back into standard ops (``split_skip_layer_norms``)
    and what ``first_token_only`` did (the nodes it narrowed, or why it left the graph as it was).

    ``opt_level=0``: the portable Python fusions only; the extended graph optimizations every
    onnxruntime session applies at load time stay with the board's own session. The saved graph is
    typed by onnxruntime's symbolic shape inference, which knows the contrib ops' outputs, so the
    int8 quantizers (which read tensor types) see every float tensor.
    """
    import onnx
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    from onnxruntime.transformers import optimizer

    heads, hidden, _ = attention_shape(config)
    fused = optimizer.optimize_model(
        str(path),
        model_type="bert",
        num_heads=heads,
        hidden_size=hidden,
        optimization_options=fusion_options(attention),
        opt_level=0,
    )
    counts = {op: int(n) for op, n in fused.get_fused_operator_statistics().items() if n}
    split = split_skip_layer_norms(fused.model)
    if split:
        counts[SPLIT_OP] = counts.get(SPLIT_OP, 0) - split
        counts["LayerNormalization"] = counts.get("LayerNormalization", 0) + split
    counts = {op: n for op, n in counts.items() if n}
    fused.save_model_to_file(str(path))
    typed = SymbolicShapeInference.infer_shapes(onnx.load(str(path)), auto_merge=True)
    first_token = first_token_only(typed)
    if isinstance(first_token, int):  # the sliced tensors are typed again from scratch
        typed = SymbolicShapeInference.infer_shapes(typed, auto_merge=True)
    onnx.save(typed, str(path))
    return counts, split, first_token


SPLIT_OP = "SkipLayerNormalization"
TOKEN_WISE_OPS = frozenset(
    {"MatMul", "Add", "Sub", "Mul", "Div", "LayerNormalization", SPLIT_OP, "BiasGelu", "Gelu", "FastGelu"}
    | {"Erf", "Tanh", "Relu", "Sqrt", "Pow", "Cast"}
)
"""Ops that compute each token's row from that row alone (a MatMul only with a constant weight)."""


def _constant_names(graph: Any) -> set[str]:
    names = {i.name for i in graph.initializer}
    names.update(o for n in graph.node if n.op_type == "Constant" for o in n.output)
    return names


def _first_token_select(graph: Any) -> Any | None:
    """The one node that picks token 0 (``Gather(hidden, 0, axis=1)``, BERT's pooler and DistilBERT's
    head), or None when the graph has no such node or more than one."""
    from onnx import helper, numpy_helper

    values = {i.name: numpy_helper.to_array(i) for i in graph.initializer if not i.dims}  # scalars only
    for node in graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if node.op_type == "Constant" and value is not None:  # value_int(s) and the like: not an index here
            values[node.output[0]] = numpy_helper.to_array(value)
    found = [
        n
        for n in graph.node
        if n.op_type == "Gather"
        and {a.name: helper.get_attribute_value(a) for a in n.attribute}.get("axis", 0) == 1
        and n.input[1] in values
        and values[n.input[1]].shape == ()
        and int(values[n.input[1]]) == 0
    ]
    return found[0] if len(found) == 1 else None


def first_token_only(model: Any) -> int | str:
    """Run the last encoder layer after its attention on token 0 alone, when that is all the head reads.

    A classifier whose head reads only the first token (BERT's pooler, DistilBERT's pre-classifier)
    uses the last layer's other rows for nothing: its attention needs every token's key and value,
    but the attention output projection, the feed-forward block and their norms compute each row on
    its own. ``model`` (a typed ``onnx.ModelProto``, changed in place) gets a ``Slice`` to the first
    position on the attention's output and on every hidden state that joins after it (the residual),
    so those ops run on one row instead of the whole sequence; the logits are the same. Returns how
    many nodes now run on one row, or why the graph was left as it was (the export check then compares
    the result with PyTorch at several shapes either way).
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    select = _first_token_select(graph)
    if select is None:
        return "the head does not read the first token alone (no single Gather of position 0)"
    producers = {o: n for n in graph.node for o in n.output}
    attention = [n for n in graph.node if n.op_type in ATTENTION_OPS.values()]
    if not attention:
        return "no fused attention"
    start = attention[-1].output[0]
    upstream: set[str] = set()
    stack = [select.input[0]]
    while stack:  # every tensor the selected hidden state is computed from
        name = stack.pop()
        if name in upstream or name not in producers:
            continue
        upstream.add(name)
        stack.extend(producers[name].input)
    if start not in upstream:
        return "the first-token select does not follow the last attention"
    region, reached = [], {start}
    for node in graph.node:  # topological order: the nodes between the last attention and the select
        if any(i in reached for i in node.input) and node.output[0] in upstream:
            region.append(node)
            reached.update(node.output)
    constants = _constant_names(graph)
    outputs = {o.name for o in graph.output}
    shapes = {v.name: v.type.tensor_type.shape for v in graph.value_info}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    inside = {id(n) for n in region} | {id(select)}
    joining: set[str] = set()
    for node in region:
        if node.op_type not in TOKEN_WISE_OPS or (
            node.op_type == "MatMul" and node.input[1] not in constants
        ):
            return f"{node.name or node.op_type} ({node.op_type}) after the last attention mixes tokens"
        for name in node.output:
            if name in outputs or any(id(c) not in inside for c in consumers.get(name, [])):
                return f"{name} after the last attention is read outside the layer"
        joining.update(i for i in node.input if i and i not in reached and i not in constants)
    for name in joining | {start}:
        if name not in producers:
            return f"graph input {name} joins after the last attention"
        shape = shapes.get(name)
        if shape is None or len(shape.dim) != 3:
            return f"{name} joins after the last attention without a known [batch, sequence, hidden] shape"
    first = {"starts": [0], "ends": [1], "axes": [1]}
    for key, value in first.items():
        graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), f"first_token_{key}"))
    sliced = {name: f"{name}_first_token" for name in sorted(joining | {start})}
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for name in node.output:
            if name in sliced:
                bounds = [f"first_token_{k}" for k in first]
                nodes.append(helper.make_node("Slice", [name, *bounds], [sliced[name]], name=sliced[name]))
    for node in region:
        for index, name in enumerate(node.input):
            if name in sliced:
                node.input[index] = sliced[name]
    del graph.node[:]
    graph.node.extend(nodes)
    narrowed = {o for n in region for o in n.output}
    kept = [v for v in graph.value_info if v.name not in narrowed]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    return len(region)


def split_skip_layer_norms(model: Any) -> int:
    """Rewrite each ``SkipLayerNormalization`` of ``model`` (an ``onnx.ModelProto``, in place) as
    ``Add(input, skip)``, ``Add(bias)`` and the standard ``LayerNormalization``; return how many.

    The arithmetic is the op's own (input + skip + bias, then the norm with its epsilon), but ONNX
    Runtime's CPU kernel for the contrib op is several times slower than the three standard kernels
    at batch 1: 14% of the runtime call of the SST-2 headline and 21% of MRPC's on this machine.
    The bias is added last because ONNX Runtime's own load-time ``SkipLayerNormFusion`` matches a bias
    added first (and an ``Add`` of two same-shaped tensors right before the norm) and would fuse the
    contrib op back. Graphs below opset 17 (no ``LayerNormalization``) keep the contrib op.
    """
    from onnx import helper

    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 17 or not any(n.op_type == SPLIT_OP for n in graph.node):
        return 0
    nodes, split = [], 0
    for node in graph.node:
        if node.op_type != SPLIT_OP:
            nodes.append(node)
            continue
        x, skip, gamma, *rest = node.input
        beta = rest[0] if rest else ""
        bias = rest[1] if len(rest) > 1 else ""
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-12)
        outputs = list(node.output) + [""] * (4 - len(node.output))
        stem = node.name or outputs[0]
        total = outputs[3] if outputs[3] and not bias else f"{stem}_skip_sum"
        nodes.append(helper.make_node("Add", [x, skip], [total], name=f"{stem}_add_skip"))
        if bias:
            summed = outputs[3] or f"{stem}_sum"
            nodes.append(helper.make_node("Add", [total, bias], [summed], name=f"{stem}_add_bias"))
            total = summed
        norm_out = [outputs[0]] + ([outputs[1], outputs[2]] if outputs[1] or outputs[2] else [])
        nodes.append(
            helper.make_node(
                "LayerNormalization",
                [total, gamma] + ([beta] if beta else []),
                norm_out,
                name=f"{stem}_norm",
                axis=-1,
                epsilon=epsilon,
            )
        )
        split += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return split


def unfused_reason(counts: dict[str, int], config: Any, attention: str) -> str | None:
    """Why the fused graph is not the one to ship, or ``None`` when attention fused in every layer."""
    layers = attention_shape(config)[2]
    got = counts.get(ATTENTION_OPS[attention], 0)
    if layers and got == layers:
        return None
    return (
        f"ORT's optimizer fused attention in {got} of {layers or 'an unknown number of'} layers "
        f"(fused ops: {counts or 'none'})"
    )


def export_fused(module: Classifier, path: Path, profile: TargetProfile, attention: str) -> dict[str, Any]:
    """Write the fused graph at ``path``; return the fusion record (``applied``, fused ``ops``, ``reason``).

    Anything that keeps attention from fusing (an exporter error, an unmatched pattern) becomes the
    record's ``reason`` and ``applied`` stays false: the caller then exports the unfused graph.
    """
    config = module.model.config
    record: dict[str, Any] = {
        "requested": True,
        "applied": False,
        "tool": FUSION_TOOL,
        "attention": attention,
        "ops": {},
    }
    try:
        trace_for_fusion(module, path, opset=profile.opset, input_dtype=profile.input_dtype)
        record["ops"], split, first_token = fuse_graph(path, config, attention)
        record["first_token_only"] = (
            {"applied": True, "nodes": first_token}
            if isinstance(first_token, int)
            else {"applied": False, "reason": first_token}
        )
        if split:
            record["split"] = {
                SPLIT_OP: split,
                "into": "Add, Add, LayerNormalization",
                "why": "ONNX Runtime's CPU kernel for the contrib op is slower at batch 1",
            }
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        record["reason"] = f"the fusable export failed: {type(exc).__name__}: {first}"
        return record
    reason = unfused_reason(record["ops"], config, attention)
    if reason is not None:
        record["reason"] = reason
        return record
    record["applied"] = True
    return record


def _tensor_key(tensor: Any) -> str:
    from onnx import numpy_helper

    array = numpy_helper.to_array(tensor)
    digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
    return f"{tensor.data_type}:{list(tensor.dims)}:{digest}"


def _rename_inputs(graph: Any, renames: dict[str, str]) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        for attr in node.attribute:
            for sub in [attr.g, *attr.graphs] if attr.type in (5, 10) else []:
                _rename_inputs(sub, renames)


def dedupe_initializers(model: Any) -> int:
    """Store each distinct constant tensor once; return how many duplicate initializers were removed."""
    graph = model.graph
    first: dict[str, str] = {}
    renames: dict[str, str] = {}
    outputs = {o.name for o in graph.output}
    for init in graph.initializer:
        if init.name in outputs:
            continue
        key = _tensor_key(init)
        if key in first:
            renames[init.name] = first[key]
        else:
            first[key] = init.name
    if renames:
        _rename_inputs(graph, renames)
        kept = [init for init in graph.initializer if init.name not in renames]
        del graph.initializer[:]
        graph.initializer.extend(kept)
    return len(renames)


def fold_weight_transposes(model: Any) -> int:
    """Replace ``Transpose(initializer)`` nodes by a transposed initializer; return how many were folded.

    The exporter folds the transpose of a weight used once, but keeps a ``Transpose`` node for a weight
    several layers share (a tied layer). The transposed copy replaces the original, which is dropped
    when nothing else reads it, so the weight is still stored once and now feeds its MatMuls directly.
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    overridable = {value.name for value in graph.input}  # an input's default: keep it as it is
    inits = {init.name: init for init in graph.initializer if init.name not in overridable}
    readers: dict[str, int] = {}
    for name in [*_all_inputs(graph), *(o.name for o in graph.output)]:
        readers[name] = readers.get(name, 0) + 1
    folded: dict[tuple[str, tuple[int, ...]], str] = {}
    renames: dict[str, str] = {}
    dropped = []
    for node in graph.node:
        if node.op_type != "Transpose" or node.input[0] not in inits:
            continue
        source = inits[node.input[0]]
        array = numpy_helper.to_array(source)
        perm = next((tuple(a.ints) for a in node.attribute if a.name == "perm"), ())
        perm = perm or tuple(reversed(range(array.ndim)))
        key = (source.name, perm)
        if key not in folded:
            taken = {init.name for init in graph.initializer} | set(folded.values())
            name = f"{source.name}_Transposed"
            folded[key] = name if name not in taken else f"{name}_{'_'.join(map(str, perm))}"
            graph.initializer.append(
                numpy_helper.from_array(np.ascontiguousarray(array.transpose(perm)), folded[key])
            )
        renames[node.output[0]] = folded[key]
        readers[source.name] -= 1
        dropped.append(node)
    for node in dropped:
        graph.node.remove(node)
    _rename_inputs(graph, renames)
    for value in [o for o in graph.output if o.name in renames]:  # a folded output keeps its name
        graph.node.append(helper.make_node("Identity", [renames[value.name]], [value.name]))
    unread = [init for init in graph.initializer if readers.get(init.name, 1) == 0]
    for init in unread:
        graph.initializer.remove(init)
    return len(dropped)


def _all_inputs(graph: Any) -> list[str]:
    """Every node input of ``graph``, its subgraphs' (If/Loop bodies) included."""
    names = []
    for node in graph.node:
        names.extend(node.input)
        for attr in node.attribute:
            for sub in [attr.g, *attr.graphs] if attr.type in (5, 10) else []:
                names.extend(_all_inputs(sub))
    return names


def strip_trace_metadata(model: Any) -> None:
    """Drop per-node trace metadata: stack traces hold this machine's file paths and make the hash unstable.

    Only each node's module scope (``pkg.torch.onnx.name_scopes``) is kept: it maps a node back to a
    layer when that layer stays in float, and costs a few bytes per node.
    """
    for node in model.graph.node:
        kept = [p for p in node.metadata_props if p.key == SCOPES_KEY]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)


def tidy_onnx(path: Path) -> int:
    """Fold weight transposes, merge duplicate initializers and strip trace metadata in place; return
    the merged count."""
    import onnx

    model = onnx.load(str(path))
    fold_weight_transposes(model)
    removed = dedupe_initializers(model)
    strip_trace_metadata(model)
    onnx.save(model, str(path))
    return removed


def onnx_runner(path: Path, threads: int = 1) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """Logits from onnxruntime on the CPU for numpy feeds (cast to the model's input dtypes)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    dtypes = {i.name: np.int64 if i.type == "tensor(int64)" else np.int32 for i in session.get_inputs()}

    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        return session.run(["logits"], {k: np.asarray(feeds[k]).astype(t) for k, t in dtypes.items()})[0]

    return run


def graph_inputs(path: Path) -> list[dict[str, Any]]:
    """The manifest's ``inputs``: name, dtype and shape (symbolic axes by name) as stored in the file."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    out = []
    for value in model.graph.input:
        if value.name in inits:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_param or d.dim_value for d in tensor.shape.dim]
        out.append(
            {
                "name": value.name,
                "dtype": ONNX_DTYPES.get(tensor.elem_type, str(tensor.elem_type)),
                "shape": shape,
            }
        )
    return out


def export_onnx(
    model: Any,
    tokenizer: Any,
    out_dir: Path,
    profile: TargetProfile,
    *,
    name: str | None = None,
    texts: list[str] | None = None,
    pairs: list[str] | None = None,
    max_length: int | None = None,
    source: dict[str, Any] | None = None,
    fuse: bool = False,
    attention: str = "separate",
) -> dict[str, Any]:
    """Export ``model`` (a Hugging Face sequence classifier) as an fp32 ONNX artifact folder at ``out_dir``.

    ``texts``/``pairs`` are real inputs for the export check (default: built-in sentences);
    ``max_length`` is the truncation length recorded for callers (default: the profile's);
    ``fuse`` writes ORT's fused graph when attention fuses in every layer (the manifest's ``fusion``
    says which graph was written and why); ``attention`` is the fused graph's layout of the query/key/value
    projections (``fusion_options``).
    Returns the manifest written to ``out_dir/manifest.json``.
    """
    if profile.format != "onnx":
        raise ExportError(f"target '{profile.name}' wants {profile.format}, not onnx")
    if attention not in ATTENTION_OPS:
        raise ExportError(f"attention '{attention}' is not one of {', '.join(ATTENTION_OPS)}")
    module = Classifier(model.eval()).eval()
    max_length = max_length or profile.max_length

    def check(path: Path) -> dict[str, Any]:
        return check_onnx(module, tokenizer, path, texts or SAMPLE_TEXTS, pairs, max_length)

    with atomic_dir(out_dir) as folder:
        path = folder / MODEL_FILES["onnx"]
        fusion: dict[str, Any] = {"requested": False, "applied": False}
        checked = None
        if fuse:
            fusion = export_fused(module, path, profile, attention)
            if fusion["applied"]:
                removed = tidy_onnx(path)
                try:
                    checked = check(path)
                except Exception as exc:  # a wrong graph (ExportError), or one onnxruntime cannot load
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                    fusion.update(applied=False, reason=f"the fused graph failed the export check: {first}")
            if checked is None:
                log.warning(
                    "onnx export: %s; writing the unfused graph instead (fuse: false skips the attempt)",
                    fusion["reason"],
                )
        if checked is None:
            trace_to_onnx(
                module,
                path,
                opset=profile.opset,
                input_dtype=profile.input_dtype,
                seq_max=max_positions(model),
            )
            removed = tidy_onnx(path)
            checked = check(path)
        if removed:
            log.info("onnx export: merged %d duplicate initializers (shared weights)", removed)
        manifest = finish_artifact(
            folder,
            model=model,
            tokenizer=tokenizer,
            name=name or Path(out_dir).name,
            fmt="onnx",
            target=profile.name,
            threads=profile.threads,
            precision="fp32",
            quantization=None,
            inputs=graph_inputs(path),
            num_labels=model.config.num_labels,
            batch="batch",
            max_length=max_length,
            sequence_lengths=profile.sequence_lengths,
            text_pair=pairs is not None,
            source=source,
            check={**checked, "merged_initializers": removed},
            fusion=fusion,
        )
    return manifest


def check_onnx(
    module: Classifier, tokenizer: Any, path: Path, texts: list[str], pairs: list[str] | None, max_length: int
) -> dict[str, Any]:
    def encode(
        chosen: list[str], chosen_pairs: list[str] | None, length: int | None
    ) -> dict[str, np.ndarray]:
        return encode_batch(
            tokenizer, chosen, chosen_pairs, module.names, length=length, max_length=max_length
        )

    cases = check_cases(texts, pairs, encode, [None], batches=(1, 3, 8))
    return compare_outputs(
        torch_reference(module), onnx_runner(path), cases, what=f"{path.name} export check"
    )
