"""The GPU-minded choices of the torch lowering (benchmarks/torch_op_choices.py measures them):
GEMM + activation epilogues, packed q/k/v projections, cuDNN's fused conv + ReLU, padding of
unaligned half-precision GEMMs, and rules that must see through fp16-rounded constants."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import graphopt
import graphopt.kernels  # noqa: F401  (registers torch.ops.graphopt.*)
import graphopt.ops.torch_lowering
from graphopt.ir.fx_view import FxView
from graphopt.ops.torch_lowering import GRAPHOPT, FxBuilder
from graphopt.passes import fx_passes
from graphopt.pattern.native import RewriteDeclined
from graphopt.torch_backend import last_graph, trace_to_aten

aten = torch.ops.aten
NO_INDUCTOR = {"inductor": False}


pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py


def _applied() -> dict[str, int]:
    return {name: s.applications for name, s in graphopt.last_report().rules.items() if s.applications}


def _targets() -> list[Any]:
    return [n.target for n in last_graph().graph.nodes if n.op == "call_function"]


def _compile(model: Any, *args: torch.Tensor, options: dict[str, Any] = NO_INDUCTOR) -> torch.Tensor:
    with torch.no_grad():
        return torch.compile(model, backend="graphopt", options=options)(*args)


# --------------------------------------------------------------------------- GEMM epilogues


class LinearThen(nn.Module):
    def __init__(self, activation: Any, bias: bool = True) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 32, bias=bias)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.linear(x))


@pytest.mark.parametrize("shape", [(6, 16), (2, 5, 16)])  # 3-D: a view sits between the GEMM and the activation
def test_gemm_relu_becomes_one_epilogue_gemm(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = LinearThen(torch.relu).eval()
    x = torch.randn(*shape)
    torch.testing.assert_close(_compile(model, x), model(x), atol=1e-5, rtol=1e-5)
    assert _applied()["FuseGemmActivation"] == 1
    calls = [n for n in last_graph().graph.nodes if n.target is aten._addmm_activation.default]
    assert len(calls) == 1 and not calls[0].kwargs.get("use_gelu", False)
    assert aten.relu.default not in _targets() and aten.addmm.default not in _targets()


def test_gemm_gelu_tanh_epilogue_is_for_cuda_tensors_only() -> None:
    """aten._addmm_activation(use_gelu=True) is the tanh GELU on CUDA but the erf one on the
    CPU: on the CPU the rule is refused (and says why); on CUDA tensors it lowers."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(0)
    model = LinearThen(lambda y: F.gelu(y, approximate="tanh")).eval()
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(_compile(model, x), model(x), atol=1e-5, rtol=1e-5)
    stats = graphopt.last_report().rules["FuseGemmActivation"]
    assert stats.applications == 0 and any("CUDA tensors only" in m.reason for m in stats.near_misses)
    with FakeTensorMode() as mode:
        inputs = [torch.empty(10, 16, device="cuda"), torch.empty(16, 32, device="cuda"), torch.empty(32, device="cuda")]
    (out,) = GRAPHOPT["GemmActivation"].fn(FxBuilder(None, mode, evaluate=True), inputs, {"activation": "GeluTanh"}, {0})
    assert tuple(out.shape) == (10, 32) and out.device.type == "cuda"


def test_gemm_relu_is_left_to_inductor_on_the_cpu() -> None:
    """With inductor on the CPU, aten._addmm_activation is addmm then an in-place ReLU (no fused
    kernel) that inductor cannot fuse into: the rule is refused and says why (OPT on CPU:
    1.03x inductor with it, benchmarks/RESULTS.md 2026-11-28); on CUDA tensors it lowers."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = LinearThen(torch.relu).eval()
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(_compile(model, x, options={}), model(x), atol=1e-5, rtol=1e-5)
    stats = graphopt.last_report().rules["FuseGemmActivation"]
    assert stats.applications == 0 and any("inductor fuses the ReLU itself" in m.reason for m in stats.near_misses)
    assert aten._addmm_activation.default not in _targets()
    with FakeTensorMode() as mode:
        inputs = [torch.empty(10, 16, device="cuda"), torch.empty(16, 32, device="cuda"), torch.empty(32, device="cuda")]
    (out,) = GRAPHOPT["GemmActivation"].fn(FxBuilder(None, mode, evaluate=True, inductor=True), inputs, {"activation": "Relu"}, {0})
    assert tuple(out.shape) == (10, 32) and out.device.type == "cuda"


@pytest.mark.parametrize("activation, bias", [
    (F.gelu, True),  # erf GELU: cuBLASLt has no epilogue for it
    (torch.sigmoid, True),
    (torch.relu, False),  # no bias: a MatMul, not a Gemm with a bias
])
def test_gemm_activation_negative_cases(activation: Any, bias: bool) -> None:
    torch.manual_seed(0)
    model = LinearThen(activation, bias=bias).eval()
    x = torch.randn(6, 16)
    torch.testing.assert_close(_compile(model, x), model(x), atol=1e-5, rtol=1e-5)
    assert not {"FuseGemmActivation"} & set(_applied())
    assert aten._addmm_activation.default not in _targets()


def test_gemm_activation_stays_out_where_gradients_flow() -> None:
    torch.manual_seed(0)
    model = LinearThen(torch.relu)
    x = torch.randn(6, 16)
    model(x).sum().backward()
    expected = model.linear.weight.grad.clone()
    model.zero_grad()
    torch.compile(model, backend="graphopt", options=NO_INDUCTOR)(x).sum().backward()
    torch.testing.assert_close(model.linear.weight.grad, expected)
    report = graphopt.last_report()
    assert report.target == "torch-train" and "FuseGemmActivation" not in _applied()
    assert any("torch-train has no lowering for graphopt.GemmActivation" in m.reason for m in report.rules["FuseGemmActivation"].near_misses)
    assert "no derivative" in graphopt.ops.torch_lowering.unavailable_graphopt_ops(training=True)["GemmActivation"]


# ONNX models: tests/test_rules_gemm_activation.py (com.microsoft.FusedGemm on ort-cpu).


# --------------------------------------------------------------------------- packed q/k/v


class SelfAttention(nn.Module):
    def __init__(self, hidden: int = 32, heads: int = 4, bias: bool = True, cross: bool = False) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(hidden, hidden, bias=bias) for _ in range(3))
        self.heads, self.cross = heads, cross

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        source = memory if self.cross else x

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(batch, -1, self.heads, hidden // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(source)), heads(self.v(source)))
        return out.transpose(1, 2).reshape(batch, seq, hidden)


def test_self_attention_projections_pack_into_one_gemm() -> None:
    torch.manual_seed(0)
    model = SelfAttention().eval()
    x, memory = torch.randn(2, 7, 32), torch.randn(2, 5, 32)
    torch.testing.assert_close(_compile(model, x, memory), model(x, memory), atol=1e-5, rtol=1e-5)
    assert _applied()["PackSdpaProjections"] == 1
    report = graphopt.last_report()
    assert report.after.ops["Gemm"] == 1 and report.after.ops["Split"] == 1
    gemms = [n for n in last_graph().graph.nodes if n.target is aten.addmm.default]
    assert len(gemms) == 1 and tuple(gemms[0].meta["val"].shape) == (14, 96)  # q, k and v side by side


@pytest.mark.parametrize("kwargs", [{"cross": True}, {"bias": False}])
def test_projections_of_different_inputs_or_without_bias_stay_apart(kwargs: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = SelfAttention(**kwargs).eval()
    x, memory = torch.randn(2, 7, 32), torch.randn(2, 5, 32)
    torch.testing.assert_close(_compile(model, x, memory), model(x, memory), atol=1e-5, rtol=1e-5)
    assert "PackSdpaProjections" not in _applied()
    assert "Split" not in graphopt.last_report().after.ops


# --------------------------------------------------------------------------- fp16 constants


def test_gelu_tanh_written_out_in_fp16_is_recognised() -> None:
    """GPT-2's gelu_new in half precision: sqrt(2/pi) and 0.044715 are stored rounded to fp16."""

    def gelu_new(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    x = torch.randn(4, 64, dtype=torch.float16)
    got = _compile(gelu_new, x)
    torch.testing.assert_close(got, gelu_new(x), atol=2e-3, rtol=2e-3)
    assert _applied() == {"FuseGeluTanh": 1}
    assert graphopt.last_report().after.ops == {"Gelu": 1}


def test_a_constant_that_is_not_the_rounded_coefficient_is_not_gelu() -> None:
    def almost_gelu(x: torch.Tensor) -> torch.Tensor:  # 0.05 instead of 0.044715: another function
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.05 * torch.pow(x, 3.0))))

    x = torch.randn(4, 64, dtype=torch.float16)
    torch.testing.assert_close(_compile(almost_gelu, x), almost_gelu(x), atol=2e-3, rtol=2e-3)
    assert "FuseGeluTanh" not in _applied()


# --------------------------------------------------------------------------- padded GEMMs


def _padded(fn: Any, *args: torch.Tensor) -> tuple[Any, int]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    traced = trace_to_aten(fn, [mode.from_tensor(a) for a in args], mode)
    view = FxView(traced, mode)
    changed = fx_passes.pad_unaligned_gemms(traced, view.add_constant, mode, devices=("cpu",))
    traced.graph.lint()
    traced.recompile()
    return traced, changed


@pytest.mark.parametrize("bias", [True, False])
def test_unaligned_half_precision_gemm_is_padded_and_sliced(bias: bool) -> None:
    torch.manual_seed(0)
    lm_head = nn.Linear(64, 301, bias=bias).half()  # N = 301: not a multiple of 8
    x = torch.randn(5, 64, dtype=torch.float16)
    with torch.no_grad():
        traced, changed = _padded(lm_head, x)
        got = traced(x)
        expected = lm_head(x)
    assert changed == 1
    products = [n for n in traced.graph.nodes if n.target in (aten.mm.default, aten.matmul.default, aten.addmm.default)]
    assert [tuple(n.meta["val"].shape) for n in products] == [(5, 304)]
    assert got.shape == (5, 301)
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("n, dtype", [(304, torch.float16), (301, torch.float32), (100, torch.float16)])
def test_aligned_full_precision_or_small_gemms_are_not_padded(n: int, dtype: torch.dtype) -> None:
    linear = nn.Linear(64, n).to(dtype)
    with torch.no_grad():
        _, changed = _padded(linear, torch.randn(5, 64, dtype=dtype))
    assert changed == 0


def test_gemms_are_padded_only_on_the_devices_asked_for() -> None:
    linear = nn.Linear(64, 301).half()
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with torch.no_grad():
        traced = trace_to_aten(linear, [mode.from_tensor(torch.randn(5, 64, dtype=torch.float16))], mode)
    assert fx_passes.pad_unaligned_gemms(traced, FxView(traced, mode).add_constant, mode) == 0  # default: CUDA only


# --------------------------------------------------------------------------- cuDNN fused conv


def test_fused_conv_lowers_to_conv_relu_on_cuda_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:  # fake CUDA tensors: no GPU needed
        x = torch.empty(2, 8, 16, 16, device="cuda", memory_format=torch.channels_last)
        inputs = [x, torch.empty(16, 8, 3, 3, device="cuda"), torch.empty(16, device="cuda")]
    attrs = {"activation": "Relu", "pads": [1, 1, 1, 1], "strides": [2, 2]}
    (out,) = GRAPHOPT["FusedConv"].fn(FxBuilder(None, mode, evaluate=True), inputs, attrs, {0})
    assert tuple(out.shape) == (2, 16, 8, 8) and out.device.type == "cuda"
    assert out.is_contiguous(memory_format=torch.channels_last)  # channels-last in, channels-last out


def _fused_conv_targets(inputs: list[torch.Tensor], attrs: dict[str, Any], mode: Any) -> list[Any]:
    """The ops graphopt.FusedConv lowers to, for these (fake) inputs."""
    import torch.fx as fx

    graph = fx.Graph()
    args = []
    for i, value in enumerate(inputs):
        node = graph.placeholder(f"a{i}")
        node.meta["val"] = value
        args.append(node)
    builder = FxBuilder(graph, mode)
    GRAPHOPT["FusedConv"].fn(builder, args, attrs, {0})
    return [n.target for n in builder.created]


@pytest.mark.parametrize("device, attrs, expected", [
    ("cpu", {"activation": "Relu", "pads": [1, 1, 1, 1]}, [aten.convolution.default, aten.relu.default]),
    ("cuda", {"activation": "LeakyRelu", "activation_params": [0.2]}, [aten.convolution.default, aten.leaky_relu.default]),
    ("cuda", {"activation": "Relu", "pads": [0, 0, 1, 1]}, []),  # asymmetric: neither cuDNN's kernel nor aten.convolution takes it
])
def test_fused_conv_without_the_cudnn_kernel_lowers_to_the_aten_ops(device: str, attrs: dict[str, Any], expected: list[Any]) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        inputs = [torch.empty(2, 8, 16, 16, device=device), torch.empty(16, 8, 3, 3, device=device), torch.empty(16, device=device)]
    if not expected:
        with pytest.raises(RewriteDeclined, match="pads both sides equally"):
            _fused_conv_targets(inputs, attrs, mode)
        return
    assert _fused_conv_targets(inputs, attrs, mode) == expected


@pytest.mark.parametrize("activation, params, reference", [
    ("Tanh", [], torch.tanh),
    ("HardSigmoid", [0.25, 0.4], lambda y: torch.clamp(0.25 * y + 0.4, 0, 1)),
    ("Clip", [-float(torch.finfo(torch.float32).max), 6.0], lambda y: torch.clamp(y, max=6.0)),
    (None, [], lambda y: y),
])
def test_fused_conv_on_the_cpu_computes_conv_add_activation(activation: Any, params: list[float], reference: Any) -> None:
    torch.manual_seed(0)
    x, w, b, z = torch.randn(2, 3, 7, 7), torch.randn(4, 3, 3, 3), torch.randn(4), torch.randn(2, 4, 4, 4)
    attrs = {"activation": activation, "activation_params": params, "strides": [2, 2], "pads": [1, 1, 1, 1]}
    (out,) = GRAPHOPT["FusedConv"].fn(FxBuilder(None, None, evaluate=True), [x, w, b, z], attrs, {0})
    torch.testing.assert_close(out, reference(F.conv2d(x, w, b, stride=2, padding=1) + z))


def test_conv_relu_compiles_on_the_cpu_as_the_aten_ops() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()).eval()
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(_compile(model, x), model(x))
    assert _applied().get("FuseConvActivation") == 1
    targets = _targets()
    assert aten.convolution.default in targets and aten.relu.default in targets
    assert torch.ops.graphopt.conv_relu.default not in targets


@pytest.mark.parametrize("with_residual", [False, True])
def test_conv_relu_op_matches_its_reference_and_passes_opcheck(with_residual: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 8, 9, 9).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(16, 8, 3, 3), torch.randn(16)
    z = torch.randn(2, 16, 5, 5) if with_residual else None
    args = (x, w, b, z, [2, 2], [1, 1], [1, 1], 1)
    out = torch.ops.graphopt.conv_relu(*args)
    expected = F.relu(F.conv2d(x, w, b, 2, 1) + (z if z is not None else 0))
    torch.testing.assert_close(out, expected)
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.library.opcheck(torch.ops.graphopt.conv_relu.default, args)
