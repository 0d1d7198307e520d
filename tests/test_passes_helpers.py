"""Helpers for the tests of graphopt.passes: build small models, run them with
onnxruntime (graph optimizations off, so ORT's own folding does not hide ours),
and compare outputs before/after a pass. Also a BERT-like model builder (onnx.helper
only, no torch) with the shape arithmetic of a dynamic-shape export."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "make_model",
    "to_ir",
    "to_proto",
    "run",
    "feeds_for",
    "assert_same_outputs",
    "op_types",
    "all_op_types",
    "bert_like",
]

OPSET = 18
# onnx 1.23 writes IR version 14; onnxruntime 1.31 reads up to 13.
IR_VERSION = 10


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
    *,
    opset: int = OPSET,
    functions: Sequence[onnx.FunctionProto] = (),
    extra_opsets: dict[str, int] | None = None,
    value_info: Sequence[onnx.ValueInfoProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(initializers), value_info=list(value_info))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    return helper.make_model(graph, opset_imports=opsets, functions=list(functions), ir_version=IR_VERSION)


def to_ir(proto: onnx.ModelProto) -> ir.Model:
    return ir.serde.deserialize_model(proto)


def to_proto(model: ir.Model) -> onnx.ModelProto:
    proto = ir.serde.serialize_model(model)
    proto.ir_version = min(proto.ir_version, IR_VERSION)
    return proto


def run(model: onnx.ModelProto | ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    proto = to_proto(model) if isinstance(model, ir.Model) else model
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=False))


def feeds_for(proto: onnx.ModelProto, dims: dict[str, int] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs; symbolic dims take their size from `dims` (default 3)."""
    rng = np.random.default_rng(seed)
    inits = {i.name for i in proto.graph.initializer}
    feeds = {}
    for value in proto.graph.input:
        if value.name in inits:
            continue
        t = value.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else (dims or {}).get(d.dim_param, 3) for d in t.shape.dim)
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[value.name] = rng.random(shape) > 0.5
        else:
            feeds[value.name] = rng.integers(0, 4, shape).astype(dtype)
    return feeds


def assert_same_outputs(
    before: onnx.ModelProto,
    after: ir.Model | onnx.ModelProto,
    feeds: dict[str, np.ndarray] | None = None,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> None:
    feeds = feeds if feeds is not None else feeds_for(before)
    if _is_valid(before):  # (a graph output without a shape already fails onnx's checker)
        onnx.checker.check_model(to_proto(after) if isinstance(after, ir.Model) else after)
    expected = run(before, feeds)
    actual = run(after, feeds)
    assert list(expected) == list(actual), "graph output names changed"
    for name, e in expected.items():
        a = actual[name]
        assert a.dtype == e.dtype and a.shape == e.shape, name
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=name)


def _is_valid(proto: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError:
        return False
    return True


def op_types(model: ir.Model | ir.Graph | ir.Function) -> list[str]:
    graph = model.graph if isinstance(model, ir.Model) else model
    return [n.op_type for n in graph]


def all_op_types(model: ir.Model) -> list[str]:
    """Op types of every node: main graph, subgraphs, functions."""
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    for function in model.functions.values():
        nodes.extend(ir.traversal.RecursiveGraphIterator(function))
    return [n.op_type for n in nodes]


# --------------------------------------------------------------------- a BERT-like model


def bert_like(layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 100, seed: int = 0) -> onnx.ModelProto:
    """An encoder in the shape of a torchscript BERT export: dynamic batch/seq, and the
    Shape -> Gather -> Unsqueeze -> Concat -> Reshape arithmetic for the head split,
    constants computed from Constant nodes (sqrt of head size), weights stored
    [out, in] and transposed in the graph."""
    rng = np.random.default_rng(seed)
    f = TensorProto.FLOAT
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    head = hidden // heads

    def w(name: str, *shape: int) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32), name))
        return name

    def const(name: str, value: np.ndarray) -> str:
        nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name)))
        return name

    def node(op: str, ins: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    def layer_norm(x: str, p: str) -> str:
        last = const(f"{p}_last", np.array([-1], np.int64))
        mean = node("ReduceMean", [x, last], f"{p}_mean")
        d = node("Sub", [x, mean], f"{p}_d")
        var = node("ReduceMean", [node("Pow", [d, const(f"{p}_two", np.array(2.0, np.float32))], f"{p}_sq"), last], f"{p}_var")
        std = node("Sqrt", [node("Add", [var, const(f"{p}_eps", np.array(1e-12, np.float32))], f"{p}_ve")], f"{p}_std")
        return node("Add", [node("Mul", [node("Div", [d, std], f"{p}_n"), w(f"{p}_g", hidden)], f"{p}_s"), w(f"{p}_b", hidden)], f"{p}_out")

    def linear(x: str, p: str, n_in: int, n_out: int) -> str:
        wt = node("Transpose", [w(f"{p}_w", n_out, n_in)], f"{p}_wt", perm=[1, 0])  # foldable, grows nothing
        return node("Add", [node("MatMul", [x, wt], f"{p}_mm"), w(f"{p}_bias", n_out)], f"{p}_out")

    emb = node("Gather", [w("word_emb", vocab, hidden), "input_ids"], "emb")
    # position ids: Range(0, seq) from the input's shape
    ids_shape = node("Shape", ["input_ids"], "ids_shape")
    seq = node("Gather", [ids_shape, const("one_i", np.array(1, np.int64))], "seq")
    pos = node("Range", [const("zero_i", np.array(0, np.int64)), seq, const("step_i", np.array(1, np.int64))], "pos")
    x = node("Add", [emb, node("Gather", [w("pos_emb", 512, hidden), pos], "pos_e")], "emb_sum")
    x = layer_norm(x, "emb_ln")
    # extended attention mask: (1 - mask) * -10000, as Cast(Sub(1, Cast(mask)))
    mask_f = node("Cast", [node("Unsqueeze", ["attention_mask", const("mask_axes", np.array([1, 2], np.int64))], "mask_u")], "mask_f", to=f)
    one_f = node("Cast", [const("one_i64", np.array(1, np.int64))], "one_f", to=f)  # foldable
    ext = node("Mul", [node("Sub", [one_f, mask_f], "inv_mask"), const("neg_big", np.array(-10000.0, np.float32))], "ext_mask")
    scale = node("Sqrt", [node("Cast", [const("head_i", np.array(head, np.int64))], "head_f", to=f)], "scale")  # foldable
    for i in range(layers):
        p = f"l{i}"
        shape = node("Shape", [x], f"{p}_shape")
        batch = node(
            "Unsqueeze",
            [node("Gather", [shape, const(f"{p}_i0", np.array(0, np.int64))], f"{p}_b"), const(f"{p}_ax0", np.array([0], np.int64))],
            f"{p}_bu",
        )
        seqd = node(
            "Unsqueeze",
            [node("Gather", [shape, const(f"{p}_i1", np.array(1, np.int64))], f"{p}_s"), const(f"{p}_ax1", np.array([0], np.int64))],
            f"{p}_su",
        )
        hd = node("Gather", [shape, const(f"{p}_i2", np.array(2, np.int64))], f"{p}_h")  # static: folds after shape inference
        n_heads = node("Div", [hd, const(f"{p}_nh", np.array(head, np.int64))], f"{p}_nheads")
        split = node(
            "Concat",
            [
                batch,
                seqd,
                node("Unsqueeze", [n_heads, const(f"{p}_ax2", np.array([0], np.int64))], f"{p}_nhu"),
                const(f"{p}_hs", np.array([head], np.int64)),
            ],
            f"{p}_split",
            axis=0,
        )
        merge = node("Concat", [batch, seqd, const(f"{p}_hid", np.array([hidden], np.int64))], f"{p}_merge", axis=0)

        def heads_of(t: str, name: str, perm: list[int], split: str = split) -> str:
            return node("Transpose", [node("Reshape", [t, split], f"{name}_r")], f"{name}_t", perm=perm)

        q = heads_of(linear(x, f"{p}_q", hidden, hidden), f"{p}_qh", [0, 2, 1, 3])
        k = heads_of(linear(x, f"{p}_k", hidden, hidden), f"{p}_kh", [0, 2, 3, 1])
        v = heads_of(linear(x, f"{p}_v", hidden, hidden), f"{p}_vh", [0, 2, 1, 3])
        scores = node("Add", [node("Div", [node("MatMul", [q, k], f"{p}_qk"), scale], f"{p}_sc"), ext], f"{p}_scm")
        ctx = node("MatMul", [node("Softmax", [scores], f"{p}_p", axis=-1), v], f"{p}_ctx")
        ctx = node("Reshape", [node("Transpose", [ctx], f"{p}_ctxt", perm=[0, 2, 1, 3]), merge], f"{p}_ctxr")
        x = layer_norm(node("Add", [linear(ctx, f"{p}_o", hidden, hidden), x], f"{p}_res1"), f"{p}_ln1")
        h = linear(x, f"{p}_up", hidden, 4 * hidden)
        # gelu(h) = 0.5 * h * (1 + erf(h / sqrt(2))), sqrt(2) computed in-graph
        sqrt2 = node("Sqrt", [const(f"{p}_two_f", np.array(2.0, np.float32))], f"{p}_sqrt2")
        erf = node("Erf", [node("Div", [h, sqrt2], f"{p}_hs2")], f"{p}_erf")
        he = node("Mul", [h, node("Add", [erf, const(f"{p}_one_f", np.array(1.0, np.float32))], f"{p}_e1")], f"{p}_he")
        g = node("Mul", [he, const(f"{p}_half", np.array(0.5, np.float32))], f"{p}_gelu")
        x = layer_norm(node("Add", [linear(g, f"{p}_down", 4 * hidden, hidden), x], f"{p}_res2"), f"{p}_ln2")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    i64 = TensorProto.INT64
    return make_model(
        nodes,
        [
            helper.make_tensor_value_info("input_ids", i64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", i64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", f, ["batch", "seq", hidden])],
        inits,
    )


def test_bert_like_model_is_valid() -> None:
    proto = bert_like(layers=1)
    onnx.checker.check_model(proto)
    out = run(proto, feeds_for(proto))["last_hidden_state"]
    assert out.shape == (3, 3, 64) and np.isfinite(out).all()
