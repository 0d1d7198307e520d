"""infer_shapes: symbolic dims kept, custom domains tolerated, nothing but types and
shapes changes, existing annotations never lose precision."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from graphopt.passes import infer_shapes, shapes

try:
    from test_passes_helpers import bert_like, make_model, to_ir, to_proto
except ImportError:  # tests/ imported as a package
    from tests.test_passes_helpers import bert_like, make_model, to_ir, to_proto

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def value(model: ir.Model, name: str) -> ir.Value:
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for out in node.outputs:
            if out.name == name:
                return out
    raise KeyError(name)


def dims(v: ir.Value) -> list:
    assert v.shape is not None, v.name
    return [d if isinstance(d, int) else d.value for d in v.shape]


def content(model: ir.Model) -> tuple[list[bytes], list[bytes]]:
    """Nodes and initializers as bytes: what infer_shapes must leave alone."""
    proto = to_proto(model)
    return [n.SerializeToString() for n in proto.graph.node], [t.SerializeToString() for t in proto.graph.initializer]


def matmul_model(extra_nodes=(), opsets=None) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((4, 8), np.float32), "w")  # 128 bytes
    big = numpy_helper.from_array(np.ones((8, 300), np.float32), "big")  # > 1 KB: stripped while inferring
    return make_model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "big"], ["m"]),
            helper.make_node("Shape", ["m"], ["s"]),
            *extra_nodes,
        ],
        [helper.make_tensor_value_info("x", F, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("m", F, None), helper.make_tensor_value_info("s", I64, None)],
        [w, big],
        extra_opsets=opsets,
    )


def test_symbolic_dims_are_kept_and_count_is_returned() -> None:
    model = to_ir(matmul_model())
    before = content(model)
    assert infer_shapes(model) == 4  # h, r, m, s
    assert dims(value(model, "h")) == ["batch", "seq", 8]
    assert dims(value(model, "m")) == ["batch", "seq", 300]
    assert value(model, "m").dtype == ir.DataType.FLOAT
    assert dims(value(model, "s")) == [3] and value(model, "s").dtype == ir.DataType.INT64
    assert content(model) == before
    assert list(model.graph.initializers) == ["w", "big"]
    assert infer_shapes(model) == 0  # nothing new the second time


def test_custom_domain_ops_do_not_stop_inference() -> None:
    extra = [
        helper.make_node("FastGelu", ["h"], ["g"], domain="com.microsoft"),
        helper.make_node("Relu", ["g"], ["after_custom"]),
        helper.make_node("Neg", ["x"], ["independent"]),
    ]
    proto = matmul_model(extra, {"com.microsoft": 1})
    proto.graph.output.extend(
        [helper.make_tensor_value_info("after_custom", F, None), helper.make_tensor_value_info("independent", F, None)]
    )
    model = to_ir(proto)
    before = content(model)
    assert infer_shapes(model) >= 4
    assert dims(value(model, "m")) == ["batch", "seq", 300]
    assert dims(value(model, "independent")) == ["batch", "seq", 4]
    assert value(model, "g").shape is None  # onnx cannot infer FastGelu: left unknown, no error
    assert content(model) == before


def test_failure_leaves_the_model_as_it_was(monkeypatch, caplog) -> None:
    model = to_ir(matmul_model())
    before = content(model)

    def boom(*args, **kwargs):
        raise RuntimeError("inference exploded")

    monkeypatch.setattr(shapes, "_call_onnx_api", boom)
    with caplog.at_level(logging.WARNING, logger=shapes.__name__):
        assert infer_shapes(model) == 0
    assert "inference exploded" in caplog.text
    assert value(model, "h").shape is None and content(model) == before


def test_initializers_hidden_from_onnx_as_onnx_ir_hides_them() -> None:
    # shapes._call_onnx_api is onnx-ir's private helper written out (importing it imports all
    # of onnx-ir's passes): onnx sees the same proto, and the model is left as it was.
    from onnx_ir.passes.common import _c_api_utils

    seen: dict[str, onnx.ModelProto] = {}

    def keep(name: str):
        def run(proto: onnx.ModelProto) -> onnx.ModelProto:
            seen[name] = proto
            return proto

        return run

    model = to_ir(matmul_model())
    graph = model.graph
    before = content(model), [v.name for v in graph.inputs], list(graph.initializers)
    _c_api_utils.call_onnx_api(keep("onnx-ir"), model)
    shapes._call_onnx_api(keep("graphopt"), model)
    assert seen["graphopt"].SerializeToString() == seen["onnx-ir"].SerializeToString()
    assert [t.name for t in seen["graphopt"].graph.initializer] == ["w"]  # the 12 KB one became an input
    assert "big" in [i.name for i in seen["graphopt"].graph.input]
    assert (content(model), [v.name for v in graph.inputs], list(graph.initializers)) == before

    def boom(proto: onnx.ModelProto) -> onnx.ModelProto:
        raise RuntimeError("inference exploded")

    try:
        shapes._call_onnx_api(boom, model)
    except RuntimeError:
        pass
    assert (content(model), [v.name for v in graph.inputs], list(graph.initializers)) == before


def test_existing_annotations_are_not_downgraded() -> None:
    # The model says h is [batch, seq, 8] with a dim name onnx would not invent,
    # and r is [B2, S2, 8]: inference must not replace them with anonymous dims.
    proto = matmul_model()
    proto.graph.value_info.extend(
        [
            helper.make_tensor_value_info("h", F, ["batch", "seq", 8]),
            helper.make_tensor_value_info("r", F, ["B2", "S2", None]),
        ]
    )
    model = to_ir(proto)
    infer_shapes(model)
    assert dims(value(model, "h")) == ["batch", "seq", 8]
    r = dims(value(model, "r"))
    assert r[2] == 8 and r[0] in ("B2", "batch") and r[1] in ("S2", "seq")


def test_subgraph_values_get_shapes() -> None:
    then_branch = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "t", [], [helper.make_tensor_value_info("t", F, None)])
    else_branch = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "e", [], [helper.make_tensor_value_info("e", F, None)])
    proto = make_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        [helper.make_tensor_value_info("x", F, ["n", 2]), helper.make_tensor_value_info("c", B, [])],
        [helper.make_tensor_value_info("y", F, None)],
    )
    model = to_ir(proto)
    assert infer_shapes(model) >= 2
    assert dims(value(model, "t")) == ["n", 2]
    assert dims(value(model, "y")) == ["n", 2]


def test_bert_like_static_dims_are_propagated() -> None:
    model = to_ir(bert_like(layers=2, hidden=64, heads=4))
    before = content(model)
    assert infer_shapes(model) > 100
    assert dims(value(model, "l0_q_out"))[2] == 64
    assert value(model, "l0_h").shape is not None and dims(value(model, "l0_h")) == []
    assert content(model) == before


def test_sequence_values_keep_sequence_types() -> None:
    # onnx-ir 1.1's own pass merged only the element type and turned these into tensors.
    seq = helper.make_graph(
        [
            helper.make_node("SequenceEmpty", [], ["empty"], dtype=TensorProto.FLOAT),
            helper.make_node("SequenceInsert", ["empty", "x"], ["one"]),
            helper.make_node("SequenceAt", ["one", "zero"], ["y"]),
        ],
        "seq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")],
    )
    model = to_ir(helper.make_model(seq, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    infer_shapes(model)
    assert isinstance(value(model, "one").type, ir.SequenceType)
    assert isinstance(value(model, "y").type, ir.TensorType)


def _reshape_read_by_shape(domain_of_gelu: str) -> ir.Model:
    """y = Reshape(x, t) with t a constant now, but y annotated with unknown dims (as the first
    inference left it while t was still computed); Shape(Gelu(y)) reads it."""
    t = numpy_helper.from_array(np.array([6, 4], np.int64), "t")
    model = to_ir(make_model(
        [
            helper.make_node("Reshape", ["x", "t"], ["y"]),
            helper.make_node("FastGelu", ["y"], ["g"], domain=domain_of_gelu),
            helper.make_node("Relu", ["y"], ["r"]),
            helper.make_node("Shape", ["r"], ["s"]),
        ],
        [helper.make_tensor_value_info("x", F, [2, 3, 4])],
        [helper.make_tensor_value_info("s", I64, None), helper.make_tensor_value_info("g", F, None)],
        [t],
        value_info=[helper.make_tensor_value_info("y", F, ["unk__1", "unk__2"]), helper.make_tensor_value_info("r", F, ["unk__1", "unk__2"])],
    ))
    return model


def test_refine_shapes_makes_what_a_shape_reads_static() -> None:
    model = _reshape_read_by_shape("com.microsoft")
    assert shapes.refine_shapes(model) == 1  # r, which Shape reads
    assert dims(value(model, "y")) == [6, 4] and dims(value(model, "r")) == [6, 4]
    assert shapes.refine_shapes(model) == 0  # nothing left that a Shape reads unknown


def test_refine_shapes_does_nothing_without_a_shape_reading_unknown_dims() -> None:
    model = _reshape_read_by_shape("com.microsoft")
    shapes.refine_shapes(model)
    value(model, "y").shape = ir.Shape([None, None])  # read by Relu and FastGelu, not by a Shape
    assert shapes.refine_shapes(model) == 0
    assert dims(value(model, "y")) == [None, None]  # inference did not run


def test_a_domain_the_model_does_not_import_does_not_stop_inference() -> None:
    # graphopt's own ops live in the model until lowering, without an opset import.
    model = _reshape_read_by_shape("graphopt")
    assert "graphopt" not in model.opset_imports
    assert shapes.refine_shapes(model) == 1
    assert dims(value(model, "r")) == [6, 4]
    assert "graphopt" not in model.opset_imports  # only the copy onnx read had it
