"""Questions tests ask of an ONNX graph."""

from __future__ import annotations

import onnx


def float_lookup_tables(path) -> list[str]:
    """Float initializers that a Gather reads rows from (embedding tables stored in fp32)."""
    graph = onnx.load(str(path)).graph
    floats = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2}
    return [n.input[0] for n in graph.node if n.op_type == "Gather" and n.input[0] in floats]
