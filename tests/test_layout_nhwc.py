"""The NHWC layout pass (graphopt/passes/layout.py) for --target ort-cuda.

onnxruntime's CPU provider has neither NhwcConv nor GroupNorm, so the pass is checked
(a) on the graph it makes (which ops, how many Transposes are left) and (b) on its
numbers, after `emulate_nhwc_ops` writes the NHWC-only ops back as Transpose + NCHW
op + Transpose: every constant it permuted, axis it remapped and Transpose it
cancelled is then exercised on the CPU."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from rule_testing import FUSED_CONV_WINS, TensorProto, assert_same_outputs, helper, init, make_model, optimize_with, rand

from graphopt.decisions import CostTable, default_table
from graphopt.ops.targets import get_target
from graphopt.passes.layout import LayoutOptions, convert_layout
from graphopt.passes.nhwc_emulation import emulate_nhwc_ops

sys.path.insert(0, str(Path(__file__).parent))
import models  # noqa: E402

#: The shipped table's ResNet-50 entries only (dense convolutions, 33+ channels, batch 32):
#: tests of how "auto" decides use these, so that entries measured later
#: (benchmarks/decisions_bench.py) do not change what they check.
RESNET_TABLE = CostTable([e for e in default_table().entries if "ResNet-50" in e.source])


def emulated(model: onnx.ModelProto) -> onnx.ModelProto:
    m = ir.serde.deserialize_model(model)
    emulate_nhwc_ops(m)
    return ir.serde.serialize_model(m)


def ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def _conv(i: str, o: str, w: str, cin: int, cout: int, inits: list, **kw) -> onnx.NodeProto:
    inits += [init(w, rand(cout, cin, 3, 3) * 0.3), init(w + "_b", rand(cout))]
    return helper.make_node("Conv", [i, w, w + "_b"], [o], pads=[1, 1, 1, 1], **kw)


def cnn_block(opset: int = 17) -> onnx.ModelProto:
    """Conv -> Mul [C,1,1] -> Add [1,C,1,1] -> Clip -> Conv -> Add residual -> Sigmoid ->
    ReduceMean(H, W, keepdims) -> Concat with a Conv -> GlobalAveragePool -> Flatten: the layout
    has to go through broadcasting constants, a residual, a reduction, a Concat and a pool."""
    inits: list = []
    c = 4
    nodes = [
        _conv("x", "c1", "w1", 3, c, inits),
        helper.make_node("Mul", ["c1", "scale"], ["m"]),
        helper.make_node("Add", ["m", "shift"], ["a"]),
        helper.make_node("Clip", ["a", "lo", "hi"], ["r"]),
        _conv("r", "c2", "w2", c, c, inits),
        helper.make_node("Add", ["c2", "r"], ["res"]),
        helper.make_node("Sigmoid", ["res"], ["s"]),
        helper.make_node("ReduceMean", ["s", "axes"] if opset >= 18 else ["s"], ["mean"], keepdims=1, **({} if opset >= 18 else {"axes": [2, 3]})),
        helper.make_node("Mul", ["s", "mean"], ["att"]),
        _conv("att", "c3", "w3", c, c, inits),
        helper.make_node("Concat", ["att", "c3"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["pool"]),
        helper.make_node("Flatten", ["pool"], ["y"]),
    ]
    inits += [
        init("scale", rand(c, 1, 1)),
        init("shift", rand(1, c, 1, 1)),
        init("lo", np.array(0.0, np.float32)),
        init("hi", np.array(6.0, np.float32)),
    ]
    if opset >= 18:
        inits.append(init("axes", np.array([2, 3], np.int64)))
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
        opset=opset,
    )


@pytest.mark.parametrize("opset", [17, 18])
def test_layout_propagates_through_elementwise_reduce_concat_and_pool(opset: int) -> None:
    model = cnn_block(opset)
    optimized, report = optimize_with(model, [], target="ort-cuda", layout="nhwc")
    after = ops(optimized)
    assert after["NhwcConv"] == 3 and after["Conv"] == 0
    # One Transpose into NHWC at the input; the pooled [N, 1, 1, C] goes back with a Reshape.
    assert after["Transpose"] == 1
    assert report.layout.transposes == 1 and report.layout.transposes_as_reshape == 1
    assert after["GlobalAveragePool"] == 0 and after["ReduceMean"] == 2
    assert_same_outputs(model, emulated(optimized))


def test_nchw_mode_changes_nothing_without_group_norm() -> None:
    model = cnn_block()
    optimized, report = optimize_with(model, [], target="ort-cuda", layout="nchw")
    assert report.layout.mode == "nchw" and report.layout.converted == {} and report.layout.transposes == 0
    assert [n.op_type for n in optimized.graph.node] == [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
def test_other_targets_do_not_run_the_pass(target: str) -> None:
    optimized, report = optimize_with(cnn_block(), [], target=target, layout="nhwc")
    assert report.layout is None and ops(optimized)["Conv"] == 3


def dense_block(channels: int = 64, batch: int = 32, dtype=np.float32, depth: int = 6) -> onnx.ModelProto:
    """Six dense 3x3 convolutions with bias and Relu at a size the cost table has measured
    (ResNet-50's convolutions: dense, 33+ channels, batch 32): as many convolutions per
    Transpose NHWC adds (2) as the measured blocks had (AUTO_CONVS_PER_TRANSPOSE)."""
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    inits = []
    nodes = []
    for i in range(depth):
        src = "x" if i == 0 else f"r{i - 1}"
        inits += [init(f"w{i}", (rand(channels, channels, 3, 3) * 0.05).astype(dtype)), init(f"b{i}", rand(channels).astype(dtype))]
        nodes += [helper.make_node("Conv", [src, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]), helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
    nodes.append(helper.make_node("Identity", [f"r{depth - 1}"], ["y"]))
    return make_model(nodes, [helper.make_tensor_value_info("x", elem, [batch, channels, 8, 8])], [helper.make_tensor_value_info("y", elem, None)], inits)


def test_auto_is_decided_by_the_cost_table() -> None:
    # Dense 64-channel convolutions at batch 32: the shipped table (ResNet-50 on the H200)
    # predicts NHWC with the bias as an Add faster in float32 and float16.
    for dtype in (np.float32, np.float16):
        _, report = optimize_with(dense_block(dtype=dtype), [], target="ort-cuda", cost_table=RESNET_TABLE)
        assert report.layout.mode == "nhwc"
        [decision] = [d for d in report.decisions if d.kind == "layout"]
        assert decision.chosen == "nhwc-add" and decision.basis == "table"
        times = {a.candidate: a.predicted_ms for a in decision.alternatives}
        assert times["nhwc-add"] < times["nchw"]
    # 4 channels at batch 2 (cnn_block) and batch 1: nobody measured them, so nothing changes.
    for model in (cnn_block(), dense_block(batch=1)):
        _, report = optimize_with(model, [], target="ort-cuda", cost_table=RESNET_TABLE)
        assert report.layout.mode == "nchw"
        [decision] = [d for d in report.decisions if d.kind == "layout"]
        assert decision.chosen == "nchw" and decision.basis == "no_entry" and "no measured entry" in decision.reason
    # auto_dtypes keeps float32 models NCHW whatever the table says.
    _, report = optimize_with(dense_block(), [], target="ort-cuda", layout=LayoutOptions(auto_dtypes=frozenset({"f16", "bf16"})), cost_table=RESNET_TABLE)
    assert report.layout.mode == "nchw"
    gemm = make_model(
        [helper.make_node("Gemm", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [init("w", rand(4, 4))],
    )
    _, report = optimize_with(gemm, [], target="ort-cuda")
    assert report.layout.mode == "nchw" and not [d for d in report.decisions if d.kind == "layout"]


def test_auto_dtypes_flip_float32_models_to_nchw() -> None:
    model = ir.serde.deserialize_model(cnn_block())
    summary = convert_layout(model, get_target("ort-cuda"), LayoutOptions(auto_dtypes=frozenset({"f16"})))
    assert summary.mode == "nchw" and not summary.converted


def test_fused_conv_is_split_in_nhwc_or_kept_between_transposes() -> None:
    inits: list = []
    nodes = [
        _conv("x", "c1", "w1", 3, 4, inits),
        helper.make_node("Relu", ["c1"], ["r1"]),
        _conv("r1", "c2", "w2", 4, 4, inits),
        helper.make_node("Add", ["c2", "r1"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    # FusedConv predicted faster (else the fused_conv decision splits them before the layout pass).
    optimized, report = optimize_with(model, None, target="ort-cuda", layout=LayoutOptions(mode="nhwc", conv_bias="add"), cost_table=FUSED_CONV_WINS)
    # FuseConvRelu and FuseConvAddRelu made two FusedConvs; NHWC splits them again.
    assert report.layout.fused_convs_split == 2
    assert ops(optimized) == Counter({"NhwcConv": 2, "Relu": 2, "Add": 3, "Transpose": 2})  # 2 biases + the residual
    assert_same_outputs(model, emulated(optimized))
    kept, report = optimize_with(model, None, target="ort-cuda", layout=LayoutOptions(mode="nhwc", fused_conv="keep"), cost_table=FUSED_CONV_WINS)
    assert ops(kept)["FusedConv"] == 2 and report.layout.converted == {}


def test_graph_output_in_nhwc_region_keeps_its_name() -> None:
    inits: list = []
    model = make_model(
        [_conv("x", "c1", "w1", 3, 4, inits), helper.make_node("Relu", ["c1"], ["y"]), _conv("y", "z", "w2", 4, 4, inits)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None), helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        inits,
    )
    optimized, report = optimize_with(model, [], target="ort-cuda", layout="nhwc")
    assert [o.name for o in optimized.graph.output] == ["y", "z"]
    assert report.layout.transposes == 3  # in, and back for each of the two outputs
    assert_same_outputs(model, emulated(optimized))


def test_internal_nhwc_pools_are_opt_in() -> None:
    inits: list = []
    model = make_model(
        [_conv("x", "c1", "w1", 3, 4, inits), helper.make_node("MaxPool", ["c1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
         _conv("p", "y", "w2", 4, 4, inits)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    default, report = optimize_with(model, [], target="ort-cuda", layout="nhwc")
    assert ops(default)["MaxPool"] == 1 and report.layout.transposes == 4  # in, around MaxPool, out
    internal, report = optimize_with(model, [], target="ort-cuda", layout=LayoutOptions(mode="nhwc", internal_nhwc_pools=True))
    [pool] = [n for n in internal.graph.node if n.op_type == "MaxPool"]
    assert pool.domain == "com.ms.internal.nhwc" and report.layout.transposes == 2
    for m in (default, internal):
        assert_same_outputs(model, emulated(m))


def test_conv_bias_form_is_forced_or_decided() -> None:
    model = cnn_block()
    kernel, _ = optimize_with(model, [], target="ort-cuda", layout=LayoutOptions(mode="nhwc", conv_bias="kernel"))
    separate, _ = optimize_with(model, [], target="ort-cuda", layout=LayoutOptions(mode="nhwc", conv_bias="add"))
    convs = [n for n in kernel.graph.node if n.op_type == "NhwcConv"]
    assert len(convs) == 3 and all(len(n.input) == 3 for n in convs)
    bias_free = [n for n in separate.graph.node if n.op_type == "NhwcConv"]
    assert len(bias_free) == 3 and all(len(n.input) == 2 for n in bias_free)
    assert ops(separate)["Add"] == ops(kernel)["Add"] + 3
    for m in (kernel, separate):
        assert_same_outputs(model, emulated(m))
    # --layout nhwc alone: the bias form is a decision. 4-channel convolutions were never
    # measured, so the bias stays in the kernel; 64 channels at batch 32 were: an Add.
    decided, report = optimize_with(model, [], target="ort-cuda", layout="nhwc", cost_table=RESNET_TABLE)
    assert ops(decided) == ops(kernel)
    [decision] = report.decisions
    assert decision.kind == "layout" and decision.chosen == "nhwc-kernel" and decision.basis == "no_entry"
    dense, report = optimize_with(dense_block(), [], target="ort-cuda", layout="nhwc", cost_table=RESNET_TABLE)
    assert all(len(n.input) == 2 for n in dense.graph.node if n.op_type == "NhwcConv")
    assert [d.chosen for d in report.decisions] == ["nhwc-add"]


# ------------------------------------------------------------------ exported CNNs

EXPORTED = [
    # builder, mode "auto" picks (NCHW: their few channels have no cost-table entry, and
    # MobileNetV2's depthwise convolutions none at any size), NhwcConv, Transposes left with
    # --layout nhwc: ResNet keeps one at the input and
    # a pair around its MaxPool; MobileNetV2 (no MaxPool) only the input's; the small CNN one
    # at the input, a pair around its ConvTranspose and one before the NCHW flatten (4
    # Transposes for 4 Convs: "auto" leaves it NCHW).
    ("resnet_tiny", "nchw", 53, 3),
    ("mobilenet_tiny", "nchw", 52, 1),
    ("small_cnn", "nchw", 4, 4),
]


@pytest.mark.parametrize("builder,auto,convs,transposes", EXPORTED)
def test_exported_cnns_in_nhwc(builder: str, auto: str, convs: int, transposes: int) -> None:
    pytest.importorskip("torch")
    path = getattr(models, builder)("dynamo-noopt")
    original = onnx.load(path)
    _, report = optimize_with(original, None, target="ort-cuda", cost_table=RESNET_TABLE)
    assert report.layout.mode == auto
    optimized, report = optimize_with(original, None, target="ort-cuda", layout="nhwc")
    after = ops(optimized)
    assert after["NhwcConv"] == convs and after["Conv"] == after["FusedConv"] == 0
    assert after["Transpose"] == report.layout.transposes == transposes
    assert_same_outputs(original, emulated(optimized), rtol=1e-3, atol=1e-4)


def test_transposes_already_in_the_model_cancel_with_the_pass_own() -> None:
    # A TF-style model: NHWC input and output around an NCHW Conv. In NHWC nothing is left to transpose.
    inits: list = []
    model = make_model(
        [helper.make_node("Transpose", ["x"], ["xc"], perm=[0, 3, 1, 2]), _conv("xc", "c", "w1", 3, 4, inits),
         helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 3, 1])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    optimized, report = optimize_with(model, [], target="ort-cuda", layout=LayoutOptions(mode="nhwc", conv_bias="add"))
    assert ops(optimized) == Counter({"NhwcConv": 1, "Add": 1, "Relu": 1})  # the bias as an Add
    assert report.layout.transposes == 0 and report.layout.transposes_cancelled == 4
    assert optimized.graph.node[0].input[0] == "x" and optimized.graph.output[0].name == "y"
    assert_same_outputs(model, emulated(optimized))


def test_float16_convs_become_nhwc_convs() -> None:
    # No FusedConv for float16 on CUDA: Conv + Relu stay apart, in NHWC, with the bias as an Add.
    inits = [init("w", rand(4, 3, 3, 3).astype(np.float16)), init("b", rand(4).astype(np.float16))]
    model = make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        inits,
    )
    optimized, report = optimize_with(model, None, target="ort-cuda", layout=LayoutOptions(mode="nhwc", conv_bias="add"))
    assert [n.op_type for n in optimized.graph.node] == ["Transpose", "NhwcConv", "Add", "Relu", "Transpose"]
    # One Conv is not worth two Transposes: "auto" leaves it alone.
    _, report = optimize_with(model, None, target="ort-cuda")
    assert report.layout.mode == "nchw"


@pytest.mark.parametrize("axes,converted", [([2, 3], True), ([-1], False)])
def test_reduce_without_keepdims_leaves_nhwc_only_when_the_kept_axes_keep_their_order(axes: list[int], converted: bool) -> None:
    inits: list = []
    model = make_model(
        [_conv("x", "c", "w1", 3, 4, inits), helper.make_node("ReduceMean", ["c"], ["y"], axes=axes, keepdims=0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    optimized, report = optimize_with(model, [], target="ort-cuda", layout="nhwc")
    assert ("ReduceMean" in report.layout.converted) == converted
    # [N, C] comes out of the NHWC reduction as it is: only the input's Transpose is left.
    assert report.layout.transposes == (1 if converted else 2)
    assert_same_outputs(model, emulated(optimized))


def test_a_vit_patch_embedding_alone_stays_nchw() -> None:
    pytest.importorskip("transformers")
    path = models.vit_tiny("dynamo")
    optimized, report = optimize_with(onnx.load(path), None, target="ort-cuda")
    assert report.layout.mode == "nchw" and report.layout.converted == {} and report.layout.transposes_inserted == 0
    assert ops(optimized)["NhwcConv"] == 0


# ------------------------------------------------------------------ issue 16: what onnxruntime resolves


def _readme_example() -> onnx.ModelProto:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_example", Path(__file__).resolve().parents[1] / "examples" / "make_example.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build()


def test_the_readme_example_in_fp16_nhwc_loads_in_onnxruntime(tmp_path: Path) -> None:
    """`--target ort-cuda --precision fp16` (layout auto -> NHWC) on the README's model wrote a model
    onnxruntime refused ([ShapeInferenceError] Incompatible dimensions): its NhwcConv shape inference
    reads the kernel from W's last dims unless kernel_shape says it, and graphopt's W is OHWI."""
    import graphopt
    from graphopt.ir.onnx_io import save_model
    from graphopt.ir.runtime_check import runtime_load_error

    # layout "nhwc" asked for: "auto" is a decision, and no measured entry covers this tiny CNN
    model, report = graphopt.optimize(ir.serde.deserialize_model(_readme_example()), target="ort-cuda", precision="fp16", layout="nhwc")
    convs = [n for n in model.graph if n.op_type == "NhwcConv"]
    assert convs and all("kernel_shape" in n.attributes for n in convs)
    for node in convs:  # [kH, kW] of the OHWI weights
        assert list(node.attributes["kernel_shape"].value) == list(node.inputs[1].shape)[1:3]
    out = tmp_path / "out.onnx"
    save_model(model, out)
    assert runtime_load_error(out) is None  # only the CUDA kernel is missing here, which is tolerated


def test_a_model_onnxruntime_cannot_resolve_is_not_written_and_verify_blames_no_rule(tmp_path: Path) -> None:
    """The same model without kernel_shape (what graphopt wrote before): save_model refuses it and
    leaves nothing; --verify names the layout pass's node and blames no rewrite (it used to leave out
    FoldConvBatchNorm, which was not the cause)."""
    import graphopt
    from graphopt.errors import ModelError
    from graphopt.ir.onnx_io import load_model, save_model
    from graphopt.verify import verify_and_repair

    source = tmp_path / "in.onnx"
    onnx.save(_readme_example(), str(source))
    options = graphopt.OptimizeOptions(target="ort-cuda", precision="fp16", layout="nhwc", precision_convs="low")
    model, report = graphopt.optimize(str(source), options)
    for node in model.graph:
        if node.op_type == "NhwcConv":
            del node.attributes["kernel_shape"]
    out = tmp_path / "out.onnx"
    with pytest.raises(ModelError, match="does not load in onnxruntime.*Incompatible dimensions"):
        save_model(model, out, reference=source)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx"]
    applied = report.total_rewrites
    _, verification = verify_and_repair(lambda: load_model(source), model, report, options, seed=0)
    # Where the CUDA provider is absent, --verify runs the NHWC ops as standard-op emulations
    # (issue 14), which need no kernel_shape: it may pass there; either way it blames no rewrite.
    if not verification.passed:
        assert "layout pass" in verification.message and "cannot repair" in verification.message
    assert verification.dropped == [] and report.total_rewrites == applied
