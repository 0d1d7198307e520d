"""Golden tests for group_norm.pdll: torch's decomposed GroupNorm (both exporters) and
opset-21 GroupNormalization -> com.microsoft.GroupNorm (+SiLU) on ort-cuda; the decomposed
form stays on `--target onnx` and ort-cpu.

com.microsoft.GroupNorm has no CPU kernel: its numerics are checked by running the
optimized model with `emulate_nhwc_ops`, which writes it back as standard ops."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, op_types, optimize_with, rand, rewrites

from graphopt.passes.nhwc_emulation import emulate_nhwc_ops

GN_RULES = ["FuseGroupNorm", "GroupNormalizationToGroupNorm", "FuseGroupNormSiLU"]


def decomposed_group_norm(
    channels: int = 8,
    groups: int = 4,
    *,
    silu: bool = False,
    back: str = "shape",
    opset: int = 17,
    dtype=np.float32,
    one: float = 1.0,
    gamma_shape: tuple[int, ...] | None = None,
) -> onnx.ModelProto:
    """x [2, C, 5, 5] -> Reshape [0, G, -1] -> InstanceNormalization(1, 0) -> Reshape back ->
    Mul gamma [C, 1, 1] -> Add beta [C, 1, 1] (-> x * Sigmoid(x)), as torch exports nn.GroupNorm."""
    shape = [2, channels, 5, 5]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    gamma_shape = gamma_shape or (channels, 1, 1)
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["g"])]
    nodes.append(helper.make_node("InstanceNormalization", ["g", "one", "zero"], ["n"], epsilon=1e-5))
    if back == "shape":
        nodes += [helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Reshape", ["n", "xs"], ["r"])]
    else:
        nodes.append(helper.make_node("Reshape", ["n", "s2"], ["r"]))
    nodes += [helper.make_node("Mul", ["r", "gamma"], ["m"]), helper.make_node("Add", ["m", "beta"], ["gn" if silu else "y"])]
    if silu:
        nodes += [helper.make_node("Sigmoid", ["gn"], ["sg"]), helper.make_node("Mul", ["gn", "sg"], ["y"])]
    inits = [
        init("s1", np.array([0, groups, -1], np.int64)),
        init("one", np.full(groups, one, dtype)),
        init("zero", np.zeros(groups, dtype)),
        init("gamma", rand(*gamma_shape).astype(dtype)),
        init("beta", rand(*gamma_shape).astype(dtype)),
    ]
    if back != "shape":
        inits.append(init("s2", np.array(shape, np.int64)))
    return make_model(
        nodes, [helper.make_tensor_value_info("x", elem, shape)], [helper.make_tensor_value_info("y", elem, None)], inits, opset=opset
    )


def group_normalization_21(channels: int = 8, groups: int = 4, silu: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["gn" if silu else "y"], num_groups=groups, epsilon=1e-5)]
    if silu:
        nodes += [helper.make_node("Sigmoid", ["gn"], ["sg"]), helper.make_node("Mul", ["gn", "sg"], ["y"])]
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, channels, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [init("scale", rand(channels)), init("bias", rand(channels))],
        opset=21,
    )


def emulated(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its NHWC-only onnxruntime ops written as standard ops (runs on CPU)."""
    m = ir.serde.deserialize_model(model)
    emulate_nhwc_ops(m)
    return ir.serde.serialize_model(m)


def group_norms(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if (n.domain, n.op_type) == ("com.microsoft", "GroupNorm")]


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


# ------------------------------------------------------------------ ort-cuda


@pytest.mark.parametrize("back", ["shape", "const"])
@pytest.mark.parametrize("silu", [False, True])
def test_decomposed_group_norm_becomes_com_microsoft_group_norm_in_nhwc(back: str, silu: bool) -> None:
    model = decomposed_group_norm(silu=silu, back=back)
    optimized, report = optimize_with(model, None, target="ort-cuda")
    assert rewrites(report, "FuseGroupNorm") == 1
    assert rewrites(report, "FuseGroupNormSiLU") == int(silu)  # SiLU first became QuickGelu (FuseSiLU), then joined the GroupNorm
    [gn] = group_norms(optimized)
    a = attrs(gn)
    assert (a["groups"], a["activation"], a["channels_last"]) == (4, int(silu), 1)
    assert a["epsilon"] == pytest.approx(1e-5)
    # The CUDA kernel is NHWC only: the layout pass put Transposes around it.
    assert op_types(optimized) == ["Transpose", "GroupNorm", "Transpose"]
    assert report.layout is not None and report.layout.transposes == 2
    inits = {i.name: i for i in optimized.graph.initializer}
    gamma = inits[gn.input[1]]
    assert gamma.data_type == TensorProto.FLOAT and list(gamma.dims) == [8]
    assert_same_outputs(model, emulated(optimized))


def test_group_norm_silu_rule_takes_mul_sigmoid_once_fuse_silu_made_it_quick_gelu() -> None:
    model = decomposed_group_norm(silu=True)
    optimized, report = optimize_with(model, ["FuseGroupNorm", "FuseGroupNormSiLU"], target="ort-cuda")
    assert rewrites(report, "FuseGroupNormSiLU") == 0  # x * Sigmoid(x) is FuseSiLU's to canonicalize
    optimized, report = optimize_with(model, ["FuseGroupNorm", "FuseSiLU", "FuseGroupNormSiLU"], target="ort-cuda")
    assert rewrites(report, "FuseSiLU") == rewrites(report, "FuseGroupNormSiLU") == 1
    [gn] = group_norms(optimized)
    assert attrs(gn)["activation"] == 1
    assert_same_outputs(model, emulated(optimized))


def test_float16_group_norm_gets_float32_gamma_and_beta() -> None:
    model = decomposed_group_norm(dtype=np.float16)
    optimized, report = optimize_with(model, GN_RULES, target="ort-cuda")
    assert rewrites(report, "FuseGroupNorm") == 1
    [gn] = group_norms(optimized)
    inits = {i.name: i for i in optimized.graph.initializer}
    assert inits[gn.input[1]].data_type == TensorProto.FLOAT and inits[gn.input[2]].data_type == TensorProto.FLOAT


def test_fp16_conversion_keeps_gamma_and_beta_float32() -> None:
    # unet-block-dynamo with --precision fp16 failed to run in onnxruntime's CUDA provider (zoo,
    # 2026-11-25): the conversion, after the rules, turned GroupNorm's gamma and beta to float16,
    # which the CUDA kernel reads as float32 (group_norm.cc: Data<float>()).
    model = decomposed_group_norm(silu=True)
    optimized, report = optimize_with(model, GN_RULES, target="ort-cuda", precision="fp16")
    assert rewrites(report, "FuseGroupNorm") == 1
    [gn] = group_norms(optimized)
    inits = {i.name: i for i in optimized.graph.initializer}
    assert inits[gn.input[1]].data_type == TensorProto.FLOAT and inits[gn.input[2]].data_type == TensorProto.FLOAT
    typed = {v.name: v.type.tensor_type.elem_type for v in [*optimized.graph.value_info, *optimized.graph.input]}
    assert typed[gn.input[0]] == typed[gn.output[0]] == TensorProto.FLOAT16  # X and Y in float16: the conversion did happen
    # The emulation reads X's type and gamma's values: it runs, and agrees with float32 within fp16's tolerance.
    assert_same_outputs(model, emulated(optimized), rtol=3e-2, atol=3e-2)


def test_channels_per_group_the_cuda_kernel_cannot_run_are_not_fused() -> None:
    model = decomposed_group_norm(channels=6, groups=2)  # 3 channels per group: the kernel needs an even count
    optimized, report = optimize_with(model, GN_RULES, target="ort-cuda")
    assert report.total_rewrites == 0 and not group_norms(optimized)
    assert "even number of channels per group" in report.rules["FuseGroupNorm"].near_misses[0].reason


def test_group_normalization_op_becomes_group_norm_on_cuda() -> None:
    model = group_normalization_21(silu=True)
    optimized, report = optimize_with(model, None, target="ort-cuda")
    assert rewrites(report, "GroupNormalizationToGroupNorm") == 1
    [gn] = group_norms(optimized)
    assert attrs(gn)["activation"] == 1
    assert_same_outputs(model, emulated(optimized))


# ------------------------------------------------------------------ standard GroupNormalization


@pytest.mark.parametrize("opset", [17, 18, 20, 21])
def test_decomposed_group_norm_stays_on_onnx(opset: int) -> None:
    # Opset 18's GroupNormalization has per-group scale and bias (and is deprecated); opset 21's
    # runs on onnxruntime as its function body, whose one-pass variance loses precision
    # (tests/test_fuzz_regressions.py): the decomposed form stays.
    optimized, report = optimize_with(decomposed_group_norm(opset=opset), GN_RULES, target="onnx")
    assert report.total_rewrites == 0
    assert "InstanceNormalization" in op_types(optimized)


def test_nothing_fuses_on_ort_cpu() -> None:
    # No GroupNorm kernel on the CPU provider, and GroupNormalization is a function there.
    optimized, report = optimize_with(decomposed_group_norm(opset=21), GN_RULES, target="ort-cpu")
    assert report.total_rewrites == 0
    assert "InstanceNormalization" in op_types(optimized)


# ------------------------------------------------------------------ near misses


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        (dict(one=2.0), "InstanceNormalization scale is not 1"),
        (dict(gamma_shape=(8, 5, 5)), "not one value per channel"),
        (dict(channels=8, groups=3), "G dividing 8"),
    ],
)
def test_what_is_not_a_group_norm_is_left_alone(kwargs: dict, reason: str) -> None:
    if kwargs.get("groups") == 3:
        model = decomposed_group_norm(channels=9, groups=3)
        model.graph.initializer[0].CopyFrom(init("s1", np.array([0, 4, -1], np.int64)))  # 9 channels do not split in 4
        reason = "G dividing 9"
    else:
        model = decomposed_group_norm(**kwargs)
    optimized, report = optimize_with(model, GN_RULES, target="ort-cuda", layout="nchw")
    assert report.total_rewrites == 0
    assert any(reason in m.reason for m in report.rules["FuseGroupNorm"].near_misses)


# ------------------------------------------------------------------ torch exports


@pytest.fixture(scope="module")
def torch_exports(tmp_path_factory) -> dict[str, str]:
    """Conv -> GroupNorm(4, 16) -> SiLU -> Conv -> GroupNorm(8, 16), exported four ways."""
    torch = pytest.importorskip("torch")
    import warnings

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.g1 = torch.nn.GroupNorm(4, 16)
            self.c2 = torch.nn.Conv2d(16, 16, 3, padding=1)
            self.g2 = torch.nn.GroupNorm(8, 16)
            with torch.no_grad():
                for g in (self.g1, self.g2):
                    g.weight.normal_()
                    g.bias.normal_()

        def forward(self, x):
            return self.g2(self.c2(torch.nn.functional.silu(self.g1(self.c1(x)))))

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 3, 8, 8)
    folder = tmp_path_factory.mktemp("gn")
    paths = {}
    configs = {
        "torchscript-17": dict(dynamo=False, opset_version=17),
        "dynamo": dict(dynamo=True, external_data=False),
        "dynamo-noopt": dict(dynamo=True, optimize=False, external_data=False),
        "dynamo-21": dict(dynamo=True, opset_version=21, external_data=False),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, kw in configs.items():
            path = str(folder / f"{name}.onnx")
            try:
                torch.onnx.export(net, (x,), path, input_names=["x"], output_names=["y"], **kw)
            except Exception as exc:  # an exporter missing in this torch
                pytest.skip(f"export {name} failed: {exc}")
            paths[name] = path
    return paths


@pytest.mark.parametrize("export", ["torchscript-17", "dynamo", "dynamo-noopt", "dynamo-21"])
def test_torch_group_norm_exports_fuse_on_ort_cuda(torch_exports: dict[str, str], export: str) -> None:
    model = onnx.load(torch_exports[export])
    optimized, report = optimize_with(model, None, target="ort-cuda", layout="nhwc")  # "auto" keeps unmeasured tiny convs NCHW
    gns = group_norms(optimized)
    assert sorted((attrs(g)["groups"], attrs(g)["activation"]) for g in gns) == [(4, 1), (8, 0)]
    ops = Counter(n.op_type for n in optimized.graph.node)
    assert ops["InstanceNormalization"] == ops["GroupNormalization"] == ops["Sigmoid"] == 0
    # In NHWC end to end: one Transpose in, one out.
    assert ops["Transpose"] == 2 and ops["NhwcConv"] == 2
    assert_same_outputs(model, emulated(optimized), rtol=1e-3, atol=1e-4)


def test_torch_group_norm_at_opset_21_stays_standard_for_plain_onnx(torch_exports: dict[str, str]) -> None:
    model = onnx.load(torch_exports["dynamo-21"])
    optimized, report = optimize_with(model, None, target="onnx")
    assert Counter(n.op_type for n in optimized.graph.node)["GroupNormalization"] == 2
    assert_same_outputs(model, optimized)


# ------------------------------------------------------------------ on FX graphs (the torch backend)
# nn.GroupNorm traces to aten.native_group_norm, which the FX view presents as GroupNormalization;
# graphopt.GroupNorm runs as aten.native_group_norm (+ aten.silu). The positive cases, on both
# kinds, are in tests/both_kinds_cases.py.


def _fx_rewrites(rule: str, module, shape=(2, 8, 4, 4), along=()) -> int:
    import torch
    from both_kinds import Case, run_case

    outcome = run_case(Case(rule, module, lambda: (torch.randn(*shape),), 0, along=tuple(along), kinds=("fx",)))
    assert outcome.fx_problem is None, outcome.fx_problem
    return outcome.fx_rewrites


def test_fx_group_norm_without_affine_parameters_is_left_alone() -> None:
    import torch.nn as nn

    assert _fx_rewrites("GroupNormalizationToGroupNorm", lambda: nn.GroupNorm(2, 8, affine=False)) == 0


def test_fx_group_norm_read_before_its_silu_keeps_the_silu_apart() -> None:
    import torch.nn as nn
    import torch.nn.functional as F

    class ReadTwice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gn = nn.GroupNorm(2, 8)

        def forward(self, x):
            y = self.gn(x)
            return F.silu(y), y + 1.0

    assert _fx_rewrites("GroupNormalizationToGroupNorm", ReadTwice) == 1
    assert _fx_rewrites("FuseGroupNormSiLU", ReadTwice, along=["GroupNormalizationToGroupNorm"]) == 0


def test_fx_group_norm_then_quick_gelu_1702_is_no_silu() -> None:
    import torch
    import torch.nn as nn

    class QuickGelu(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gn = nn.GroupNorm(2, 8)

        def forward(self, x):
            y = self.gn(x)
            return y * torch.sigmoid(1.702 * y)

    assert _fx_rewrites("FuseQuickGelu", QuickGelu) == 1
    assert _fx_rewrites("FuseGroupNormSiLU", QuickGelu, along=["GroupNormalizationToGroupNorm", "FuseQuickGelu"]) == 0


def test_group_norm_silu_compiles_to_native_group_norm_and_silu() -> None:
    import torch
    import torch.nn as nn

    import graphopt
    from graphopt.torch_backend import last_graph

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.SiLU()).eval()
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt", options={"inductor": False})(x)
        torch.testing.assert_close(got, model(x))
    applied = {name: s.applications for name, s in graphopt.last_report().rules.items() if s.applications}
    assert applied.get("GroupNormalizationToGroupNorm") == applied.get("FuseGroupNormSiLU") == 1
    targets = [n.target for n in last_graph().graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.native_group_norm.default in targets and torch.ops.aten.silu.default in targets


def test_fx_written_out_norm_over_the_wrong_axis_is_no_group_norm() -> None:
    import torch
    from both_kinds_cases import _group_norm, const, fn

    def over_groups(m, x):  # the statistics taken across the groups (axis 1), not within each
        g = x.reshape(x.shape[0], 2, -1)
        d = g - g.mean(1, keepdim=True)
        var = d.pow(2.0).mean(1, keepdim=True)
        return (d / torch.sqrt(var + 1e-5)).reshape(x.shape) * m.g + m.b

    params = {"g": const(8, 1, 1), "b": const(8, 1, 1)}
    assert _fx_rewrites("FuseGroupNorm", fn(_group_norm, **params)) == 1
    assert _fx_rewrites("FuseGroupNorm", fn(over_groups, **params)) == 0
