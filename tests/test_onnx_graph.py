"""The ONNX graph view end to end: untouched parts stay byte-identical, subgraphs
(If/Loop/Scan) and model-local functions are rewritten with outer-scope values
respected, and external data (above 2 GB too) loads and saves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper
from rule_testing import assert_same_outputs, init, make_model, optimize_with, rand, rewrites, run

import graphopt
from graphopt.ir.onnx_io import load_model, save_model

F = TensorProto.FLOAT


def conv_bn_nodes(x: str, out: str, prefix: str):
    return [
        helper.make_node("Conv", [x, f"{prefix}w"], [f"{prefix}c"], name=f"{prefix}conv"),
        helper.make_node("BatchNormalization", [f"{prefix}c", f"{prefix}g", f"{prefix}b", f"{prefix}m", f"{prefix}v"], [out], name=f"{prefix}bn"),
    ]


def conv_bn_inits(prefix: str, c: int = 4):
    return [init(f"{prefix}w", rand(c, c, 1, 1)), init(f"{prefix}g", rand(c)), init(f"{prefix}b", rand(c)), init(f"{prefix}m", rand(c)), init(f"{prefix}v", rand(c, positive=True))]


def test_untouched_nodes_initializers_and_metadata_are_unchanged() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="keep_relu", doc_string="kept as is")]
    nodes += conv_bn_nodes("r", "y", "")
    nodes.append(helper.make_node("Softmax", ["y"], ["z"], name="keep_softmax", axis=1))
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [1, 4, 3, 3])], [helper.make_tensor_value_info("z", F, None)],
                       conv_bn_inits("") + [init("unused_but_kept", np.arange(3, dtype=np.float32))])
    model.producer_name = "unit-test"
    model.doc_string = "a model doc"
    helper.set_model_props(model, {"author": "someone"})
    optimized, report = optimize_with(model, ["FoldConvBatchNorm"])
    assert rewrites(report, "FoldConvBatchNorm") == 1
    before = {n.name: n.SerializeToString() for n in model.graph.node}
    after = {n.name: n.SerializeToString() for n in optimized.graph.node}
    assert after["keep_relu"] == before["keep_relu"]
    assert after["keep_softmax"] == before["keep_softmax"]
    assert optimized.producer_name == "unit-test" and optimized.doc_string == "a model doc"
    assert {p.key: p.value for p in optimized.metadata_props} == {"author": "someone"}
    assert_same_outputs(model, optimized)


def if_model():
    then_graph = helper.make_graph(conv_bn_nodes("x", "t_out", "t_"), "then", [], [helper.make_tensor_value_info("t_out", F, None)])
    else_graph = helper.make_graph([helper.make_node("Cast", ["x"], ["e_mid"], to=TensorProto.DOUBLE), helper.make_node("Cast", ["e_mid"], ["e_out"], to=F)],
                                   "else", [], [helper.make_tensor_value_info("e_out", F, None)])
    nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph, name="if")]
    return make_model(nodes, [helper.make_tensor_value_info("cond", TensorProto.BOOL, []), helper.make_tensor_value_info("x", F, [1, 4, 3, 3])],
                      [helper.make_tensor_value_info("y", F, None)], conv_bn_inits("t_"))


def test_if_branches_are_rewritten_with_outer_scope_weights() -> None:
    model = if_model()
    optimized, report = optimize_with(model, ["FoldConvBatchNorm", "CollapseCastChain", "DropNoOpCast"])
    assert rewrites(report, "FoldConvBatchNorm") == 1
    assert rewrites(report, "CollapseCastChain") == 1
    if_node = optimized.graph.node[0]
    branches = {a.name: [n.op_type for n in a.g.node] for a in if_node.attribute}
    # Folded weights live in the branch as Constant nodes; the outer BN parameters are gone.
    assert sorted(branches["then_branch"]) == ["Constant", "Constant", "Conv"]
    assert branches["else_branch"] == ["Identity"]
    assert [i.name for i in optimized.graph.initializer] == []
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "x": rand(1, 4, 3, 3)}
        np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-4, atol=1e-5)
    scopes = {r.scope for r in report.applied}
    assert any("then_branch" in s for s in scopes) and any("else_branch" in s for s in scopes)


def test_loop_and_scan_bodies_are_rewritten() -> None:
    loop_body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["acc_in"], ["acc64"], to=TensorProto.DOUBLE),
         helper.make_node("Cast", ["acc64"], ["acc32"], to=F),
         helper.make_node("Add", ["acc32", "x"], ["acc_out"])],  # x captured from the outer graph
        "loop_body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", F, [2])],
    )
    scan_body = helper.make_graph(
        [helper.make_node("Cast", ["s_in"], ["s_mid"], to=F), helper.make_node("Neg", ["s_mid"], ["s_out"])],
        "scan_body", [helper.make_tensor_value_info("s_in", F, [2])], [helper.make_tensor_value_info("s_out", F, [2])],
    )
    nodes = [
        helper.make_node("Loop", ["trips", "", "x"], ["acc"], body=loop_body, name="loop"),
        helper.make_node("Scan", ["seq"], ["scanned"], body=scan_body, num_scan_inputs=1, name="scan"),
    ]
    model = make_model(
        nodes,
        [helper.make_tensor_value_info("x", F, [2]), helper.make_tensor_value_info("seq", F, [3, 2])],
        [helper.make_tensor_value_info("acc", F, None), helper.make_tensor_value_info("scanned", F, None)],
        [init("trips", np.array(3, np.int64))],
    )
    optimized, report = optimize_with(model, ["CollapseCastChain", "DropNoOpCast"])
    assert rewrites(report, "CollapseCastChain") == 1
    assert rewrites(report, "DropNoOpCast") == 2  # the collapsed chain in Loop, the no-op cast in Scan
    loop, scan = optimized.graph.node
    assert [n.op_type for n in loop.attribute[0].g.node] == ["Identity", "Add"]
    assert [n.op_type for n in scan.attribute[0].g.node if n.op_type == "Cast"] == []
    assert_same_outputs(model, optimized)


def test_model_local_function_body_is_rewritten() -> None:
    c = 3
    consts = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name)) for name, arr in
              (("fw", rand(c, c, 1, 1)), ("fg", rand(c)), ("fb", rand(c)), ("fm", rand(c)), ("fv", rand(c, positive=True)))]
    body = consts + [helper.make_node("Conv", ["X", "fw"], ["fc"]), helper.make_node("BatchNormalization", ["fc", "fg", "fb", "fm", "fv"], ["Y"])]
    function = helper.make_function("local", "ConvBN", ["X"], ["Y"], body, [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("ConvBN", ["x"], ["y"], domain="local")], "main",
                              [helper.make_tensor_value_info("x", F, [1, c, 2, 2])], [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)], ir_version=8)
    optimized, report = optimize_with(model, ["FoldConvBatchNorm"])
    assert rewrites(report, "FoldConvBatchNorm") == 1
    assert report.applied[0].scope.startswith("function:")
    body_ops = [n.op_type for n in optimized.functions[0].node]
    assert body_ops.count("BatchNormalization") == 0 and body_ops.count("Conv") == 1
    assert_same_outputs(model, optimized)


def test_external_data_round_trip(tmp_path: Path) -> None:
    nodes = conv_bn_nodes("x", "y", "")
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [1, 64, 3, 3])], [helper.make_tensor_value_info("y", F, None)], conv_bn_inits("", c=64))
    src = tmp_path / "in" / "model.onnx"
    src.parent.mkdir()
    on_disk = onnx.ModelProto()
    on_disk.CopyFrom(model)  # onnx.save moves the tensors of the proto it saves to external data
    onnx.save(on_disk, src, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    before = {p.name: p.stat().st_mtime_ns for p in src.parent.iterdir()}
    out = tmp_path / "out" / "model.opt.onnx"
    out.parent.mkdir()
    report = graphopt.optimize_file(src, out, enable=["FoldConvBatchNorm"])
    assert rewrites(report, "FoldConvBatchNorm") == 1
    assert {p.name: p.stat().st_mtime_ns for p in src.parent.iterdir()} == before  # input untouched
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.opt.onnx", "model.opt.onnx.data"]
    reloaded = onnx.load(out)  # loads its external data from beside it
    assert_same_outputs(model, reloaded)


def test_model_above_2gb_loads_and_saves_with_external_data(tmp_path: Path) -> None:
    # A 2.2 GB embedding table in a sparse file (no disk blocks until written) plus a
    # foldable Conv+BN: onnx-ir memory-maps the table; the output keeps it external.
    rows, dim = 550_000, 1000  # 550e6 float32 = 2.2 GB
    folder = tmp_path / "big"
    folder.mkdir()
    data = folder / "big.data"
    with open(data, "wb") as f:
        f.truncate(rows * dim * 4)
    table = ir.Value(name="table", shape=ir.Shape([rows, dim]), type=ir.TensorType(ir.DataType.FLOAT),
                     const_value=ir.ExternalTensor("big.data", offset=0, length=rows * dim * 4, dtype=ir.DataType.FLOAT, shape=ir.Shape([rows, dim]), name="table", base_dir=str(folder)))
    small = make_model(conv_bn_nodes("x", "y", "") + [helper.make_node("Gather", ["table", "ids"], ["emb"])],
                       [helper.make_tensor_value_info("x", F, [1, 4, 3, 3]), helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
                       [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("emb", F, None)], conv_bn_inits(""))
    model = ir.serde.deserialize_model(small)
    model.graph.register_initializer(table)
    gather = [n for n in model.graph if n.op_type == "Gather"][0]
    gather.replace_input_with(0, table)
    src = folder / "big.onnx"
    onnx.save(ir.serde.serialize_model(model), src)  # the table stays a reference into big.data
    assert src.stat().st_size < 1 << 20
    loaded = load_model(src)
    assert isinstance(loaded.graph.initializers["table"].const_value, ir.ExternalTensor)
    optimized, report = graphopt.optimize(loaded, enable=["FoldConvBatchNorm"])
    assert rewrites(report, "FoldConvBatchNorm") == 1
    out = tmp_path / "out.onnx"
    save_model(optimized, out)
    assert (tmp_path / "out.onnx.data").stat().st_size >= rows * dim * 4
    again = load_model(out)
    big = again.graph.initializers["table"].const_value
    assert isinstance(big, ir.ExternalTensor) and tuple(big.shape) == (rows, dim)
    assert float(np.abs(big.numpy()[-1]).max()) == 0.0
