"""graphopt.ir.symbolic: dims of values and contents of shape tensors, as exporters compute them."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import sympy
from onnx import TensorProto, helper

from graphopt.ir.onnx_view import OnnxView
from graphopt.ir.symbolic import SymbolicShapes, dims_equal
from tests.rule_testing import init, make_model


def _shapes(model):
    ir_model = ir.serde.deserialize_model(model)
    values = {v.name: v for node in ir_model.graph for v in node.outputs}
    values.update({v.name: v for v in ir_model.graph.inputs})
    return SymbolicShapes(OnnxView(ir_model)), values


def _sym(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, positive=True, integer=True)


def test_runtime_reshape_targets_resolve_to_the_input_dims() -> None:
    # TorchScript style: Reshape(x, Concat(Shape(x)[0], Shape(x)[1], [-1, 8])), then back.
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Gather", ["sh", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["sh", "i1"], ["s"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Unsqueeze", ["s", "ax0"], ["s1"]),
        helper.make_node("Concat", ["b1", "s1", "heads"], ["to4"], axis=0),
        helper.make_node("Reshape", ["x", "to4"], ["x4"]),
        helper.make_node("Transpose", ["x4"], ["xt"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["xt", "flat"], ["xf"]),
        helper.make_node("Transpose", ["xf"], ["xft"], perm=[0, 2, 1]),
    ]
    inits = [init("i0", np.array(0)), init("i1", np.array(1)), init("ax0", np.array([0])),
             init("heads", np.array([-1, 8])), init("flat", np.array([-1, 7, 8]))]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 7, 32])],
                       [helper.make_tensor_value_info("xft", TensorProto.FLOAT, None)], inits)
    sym, v = _shapes(model)
    batch = _sym("batch")
    assert sym.tensor(v["to4"]) == [batch, 7, -1, 8]
    assert sym.dims(v["x4"]) == [batch, 7, 4, 8]
    assert sym.dims(v["xt"]) == [batch, 4, 7, 8]
    assert dims_equal(sym.dims(v["xf"]), [4 * batch, 7, 8])
    assert dims_equal(sym.dims(v["xft"]), [4 * batch, 8, 7])


def test_torch_expand_shape_with_minus_one_is_evaluated() -> None:
    # Where(Equal(shape, -1), ones, shape): torch's expand(-1) as the TorchScript exporter writes it.
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Concat", ["sh", "minus1"], ["target"], axis=0),
        helper.make_node("Equal", ["target", "neg"], ["is_neg"]),
        helper.make_node("Where", ["is_neg", "ones", "target"], ["fixed"]),
        helper.make_node("Expand", ["m", "fixed"], ["mx"]),
    ]
    inits = [init("minus1", np.array([-1])), init("neg", np.array([-1, -1, -1])), init("ones", np.array([1, 1, 1]))]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"]),
                               helper.make_tensor_value_info("m", TensorProto.BOOL, ["batch", 1, 1])],
                       [helper.make_tensor_value_info("mx", TensorProto.BOOL, None)], inits)
    sym, v = _shapes(model)
    assert sym.tensor(v["fixed"]) == [_sym("batch"), _sym("seq"), 1]
    assert sym.dims(v["mx"]) == [_sym("batch"), _sym("seq"), 1]


def test_unknown_dims_are_not_equal_to_anything_else() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["z"], ["w"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 3])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None), helper.make_tensor_value_info("w", TensorProto.FLOAT, None)])
    sym, v = _shapes(model)
    assert dims_equal(sym.dims(v["y"]), sym.dims(v["x"]))  # the same value's dims
    assert not dims_equal(sym.dims(v["y"]), sym.dims(v["w"]))  # two unknown batch sizes


def test_chunk_slices_with_run_time_bounds() -> None:
    # torch's chunk(3, dim=-1) as TorchScript exports it: each third ends at ((n + 2) / 3) * k,
    # computed from Shape(x) at run time; the partial-rotary pass-through part is x[..., r:n].
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Gather", ["sh", "last"], ["n"], axis=0),
        helper.make_node("Add", ["n", "two"], ["n2"]),
        helper.make_node("Div", ["n2", "three"], ["third"]),
        helper.make_node("Mul", ["third", "one"], ["end1"]),
        helper.make_node("Slice", ["x", "zero", "end1", "last"], ["q"]),
        helper.make_node("Slice", ["q", "rot", "big", "last"], ["q_pass"]),
        helper.make_node("Shape", ["q"], ["qsh"]),
        helper.make_node("Gather", ["qsh", "last"], ["qn"], axis=0),
        helper.make_node("Slice", ["q", "rot", "qn", "last"], ["q_pass2"]),
        helper.make_node("Slice", ["y", "rot", "big", "last"], ["y_pass"]),
    ]
    inits = [init("last", np.array([-1])), init("two", np.array([2])), init("three", np.array([3])), init("one", np.array([1])),
             init("zero", np.array([0])), init("rot", np.array([4])), init("big", np.array([2**63 - 1]))]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4, "s", 48]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "d"])],
                       [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("q_pass", "q_pass2", "y_pass")], inits)
    sym, v = _shapes(model)
    b, s, d = _sym("b"), _sym("s"), _sym("d")
    assert sym.tensor(v["third"]) == [16]  # (48 + 2) / 3 truncates, as onnxruntime's integer Div does
    assert sym.dims(v["q"]) == [b, 4, s, 16]
    assert sym.dims(v["q_pass"]) == [b, 4, s, 12]
    assert sym.dims(v["q_pass2"]) == [b, 4, s, 12]
    assert dims_equal(sym.dims(v["y_pass"]), [b, d - 4])


def test_symbolic_division_only_where_it_is_the_floor() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Gather", ["sh", "i0"], ["n"], axis=0),
             helper.make_node("Div", ["n", "two"], ["half"]), helper.make_node("Sub", ["zero", "n"], ["neg"]),
             helper.make_node("Div", ["neg", "two"], ["neg_half"])]
    inits = [init("i0", np.array([0])), init("two", np.array([2])), init("zero", np.array([0]))]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                       [helper.make_tensor_value_info(n, TensorProto.INT64, None) for n in ("half", "neg_half")], inits)
    sym, v = _shapes(model)
    assert sym.tensor(v["half"]) == [sympy.floor(_sym("n") / 2)]
    assert sym.tensor(v["neg_half"]) is None  # -n / 2 truncates toward zero: not the floor, so unknown


def test_recorded_shapes_settle_what_they_can_and_leave_the_rest_to_symbolic_dims() -> None:
    # MatchContext.same_recorded_shape answers SameDims / SameStaticShape without sympy where the
    # model's recorded shapes suffice; None sends the question on to the symbolic dims.
    from graphopt.match.context import MatchContext

    def value(name: str, shape: list | None) -> ir.Value:
        return ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=None if shape is None else ir.Shape(shape))

    graph = ir.Graph([], [], nodes=[], opset_imports={"": 18})
    ctx = MatchContext(OnnxView(ir.Model(graph, ir_version=9)))
    n3, n3_again = value("a", ["N", 3]), value("b", ["N", 3])
    assert ctx.same_recorded_shape(n3, n3_again) is True  # one name, one size
    assert ctx.same_recorded_shape(n3, value("c", ["N", 3, 1])) is False  # ranks differ
    assert ctx.same_recorded_shape(n3, value("d", ["N", 4])) is False  # a static size differs
    assert ctx.same_recorded_shape(n3, value("e", ["M", 3])) is None  # other names: only the graph can tell
    assert ctx.same_recorded_shape(value("f", [None, 3]), value("g", [None, 3])) is None  # unknown dims
    assert ctx.same_recorded_shape(n3, value("h", None)) is None  # unknown rank
    assert ctx.shape_text(value("i", ["N", None, 4])) == "[N, ?, 4]"
    assert ctx.shape_text(value("j", None)) == "?"


def test_drop_no_op_reshape_asks_the_recorded_shapes_first_then_the_symbolic_dims() -> None:
    # DropNoOpReshape (SameDims) on Reshape(x, target): recorded ranks that differ settle it
    # (a flatten to [unk__0]); so do equal recorded shapes (Reshape(x, Shape(x)), its shape
    # propagated by inference); without recorded shapes the symbolic dims decide.
    from graphopt.api import OptimizeOptions, optimize

    def reshape_model(target: list[int] | None) -> ir.Model:
        inits = [] if target is None else [init("t", np.array(target))]
        nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Reshape", ["x", "sh" if target is None else "t"], ["y"]),
                 helper.make_node("Relu", ["y"], ["z"])]
        model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
                           [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits)
        return ir.serde.deserialize_model(model)

    def run(model: ir.Model, **options):  # type: ignore[no-untyped-def]
        return optimize(model, OptimizeOptions(enable=["DropNoOpReshape"], **options))[1].rules["DropNoOpReshape"]

    flattened = run(reshape_model([-1]))
    assert flattened.applications == 0
    miss = flattened.near_misses[0].reason
    assert miss.startswith("SameDims: dims [batch, 6] and [unk__") and miss.endswith("] are not known to be equal"), miss
    assert run(reshape_model(None)).applications == 1
    unrecorded = reshape_model(None)
    assert OnnxView(unrecorded).shape(unrecorded.graph.node(1).outputs[0]) is None
    assert run(unrecorded, shape_inference=False).applications == 1


def test_reduce_prod_and_max_of_gathered_dims() -> None:
    # tf2onnx's einsum: the product of the leading dims, and the batch as Max of two broadcast batches.
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Gather", ["sh", "lead"], ["g"], axis=0),
        helper.make_node("ReduceProd", ["g"], ["p"], keepdims=1),
        helper.make_node("Shape", ["z"], ["shz"]),
        helper.make_node("Gather", ["shz", "i0"], ["gz"], axis=0),
        helper.make_node("Gather", ["sh", "i0"], ["gx"], axis=0),
        helper.make_node("Max", ["gx", "gz"], ["m"]),
        helper.make_node("Min", ["g", "ten"], ["lo"]),
        helper.make_node("ReduceProd", ["g", "ax1"], ["bad"], keepdims=1),
        helper.make_node("Concat", ["p", "m", "lo", "bad"], ["t"], axis=0),
    ]
    inits = [init("lead", np.array([0, 1])), init("i0", np.array([0])), init("ten", np.array([10])), init("ax1", np.array([1]))]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3])],
                       [helper.make_tensor_value_info("t", TensorProto.INT64, None)], inits, opset=18)
    sym, v = _shapes(model)
    batch = _sym("batch")
    assert sym.tensor(v["p"]) == [4 * batch]
    assert sym.tensor(v["m"]) == [batch]  # Max(batch, 1) with batch >= 1
    assert sym.tensor(v["lo"]) == [sympy.Min(batch, 10), 4]
    assert sym.tensor(v["bad"]) is None  # axis 1 of a 1-D tensor: not a product we know
    assert sym.tensor(v["t"]) is None
