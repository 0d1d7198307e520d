"""The torch.compile backend: registration, options, reports, the FX view's presentation of
ATen ops, rewrites on small modules, and (once) inductor for the leftovers.

Transformer models are in tests/test_torch_backend_models.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import graphopt
from graphopt.errors import GraphoptError, RuleNameError
from graphopt.ir.fx_view import FxView
from graphopt.ops import torch_lowering
from graphopt.pattern.native import RewriteDeclined
from graphopt.torch_backend import TorchOptions, _rule_set, clear_reports, last_graph, torch_reports, trace_to_aten

REPO = Path(__file__).resolve().parents[1]
aten = torch.ops.aten


pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py


def _applied(report: Any) -> dict[str, int]:
    return {name: stats.applications for name, stats in report.rules.items() if stats.applications}


def _aten_graph(fn: Any, *args: Any) -> tuple[Any, FxView]:
    """fn traced to ATen as the backend traces dynamo's graphs, and the view over it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    traced = trace_to_aten(fn, [mode.from_tensor(a) for a in args], mode)
    return traced, FxView(traced, mode)


class ConvBnCast(nn.Module):
    """Conv + BatchNorm + ReLU, a lossless cast chain, a lossy one, and a constant subexpression."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8))
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = F.relu(self.bn(self.conv(x)))
        y = y * (self.scale * 2.0 + 1.0).view(1, 8, 1, 1)  # folds into one constant
        lossless = y.double().float()  # f32 -> f64 -> f32: both casts go
        lossy = y.half().float()  # f32 -> f16 -> f32 rounds: stays
        return lossless, lossy


def test_conv_bn_folding_cast_elimination_and_constant_folding() -> None:
    torch.manual_seed(0)
    model = ConvBnCast().eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend="graphopt", options={"inductor": False})(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    report = graphopt.last_report()
    applied = _applied(report)
    assert applied["FoldConvBatchNorm"] == 1
    assert applied["CollapseCastChain"] == 1 and applied["DropNoOpCast"] == 1
    assert report.passes["constant_folding"].changes >= 2  # scale * 2, + 1 (and the view of it)
    assert "BatchNormalization" not in report.after.ops
    assert report.after.ops["Cast"] == 2  # the f16 round trip
    assert report.target == "torch"


def test_matmul_bias_becomes_addmm_and_unknown_ops_stay_untouched() -> None:
    w, b = torch.randn(16, 4), torch.randn(4)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x @ w + b, dim=1)  # cumsum: no canonical op, left as it is

    x = torch.randn(3, 16)
    compiled = torch.compile(fn, backend="graphopt", options={"inductor": False})
    torch.testing.assert_close(compiled(x), fn(x))
    assert _applied(graphopt.last_report()) == {"MatMulAddToGemm": 1}
    targets = [n.target for n in last_graph().graph.nodes if n.op == "call_function"]
    assert aten.addmm.default in targets and aten.cumsum.default in targets


def test_view_presents_aten_ops_under_onnx_names() -> None:
    conv_w = torch.randn(8, 3, 3, 3)

    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        c = F.conv2d(x, conv_w, stride=2, padding=1, groups=1)
        t = y.transpose(1, 2).reshape(2, -1)
        s = torch.softmax(y, dim=-1)
        n = F.layer_norm(y, (5,), eps=1e-3)
        return c, t, s, n, y.to(torch.float16), y[:, 1:3], torch.cat([y, y], dim=1)

    gm, view = _aten_graph(fn, torch.randn(2, 3, 8, 8), torch.randn(2, 4, 5))
    keys = {view.op_key(n)[1]: n for n in view.nodes(view.graph)}
    conv = keys["Conv"]
    assert view.attr(conv, "strides") == [2, 2] and view.attr(conv, "pads") == [1, 1, 1, 1] and view.attr(conv, "group") == 1
    assert view.attr(conv, "kernel_shape") == [3, 3]
    assert view.attr(keys["Transpose"], "perm") == [0, 2, 1]
    reshape = keys["Reshape"]
    assert view.const_array(view.inputs(reshape)[1]).tolist() == [2, 20]  # aten resolved the -1
    assert view.attr(keys["Softmax"], "axis") == -1
    ln = keys["LayerNormalization"]
    assert view.attr(ln, "axis") == -1 and view.attr(ln, "epsilon") == pytest.approx(1e-3)
    assert len(view.outputs(ln)) == 3  # Y, mean, inv_std as ONNX has them
    assert view.attr(keys["Cast"], "to") == 10  # TensorProto.FLOAT16
    slice_node = keys["Slice"]
    assert [view.const_array(v).tolist() for v in view.inputs(slice_node)[1:]] == [[1], [3], [1], [1]]
    assert view.attr(keys["Concat"], "axis") == 1
    assert view.shape(view.outputs(conv)[0]) == (2, 8, 4, 4) and view.dtype(view.outputs(conv)[0]) == "f32"


def test_view_presents_scalars_as_constants_and_unknown_ops_as_opaque() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x * 0.5 + 1, 0)

    _, view = _aten_graph(fn, torch.randn(4))
    by_op = {view.op_key(n): n for n in view.nodes(view.graph)}
    mul = by_op[("", "Mul")]
    half = view.inputs(mul)[1]
    assert view.is_const(half) and view.const_array(half).item() == 0.5 and view.dtype(half) == "f32"
    assert view.inputs(mul)[1] is half  # the same object each time: the matcher compares identity
    assert ("torch", "aten.cumsum.default") in by_op


def test_canonical_lowering_round_trips_through_the_view() -> None:
    """Every canonical op a rule can build is emitted as ATen calls that the view reads back as that op."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> Any:
        return x @ w, x.t()

    gm, view = _aten_graph(fn, torch.randn(4, 4), torch.randn(4, 4))
    x, w = [n for n in gm.graph.nodes if n.op == "placeholder"]
    built = {
        "Gemm": view.new_node(view.graph, "", "Gemm", [x, w, w], {"transB": 1, "alpha": 2.0}, 1),
        "Transpose": view.new_node(view.graph, "", "Transpose", [x], {"perm": [1, 0]}, 1),
        "Gelu": view.new_node(view.graph, "", "Gelu", [x], {"approximate": "tanh"}, 1),
        "Softmax": view.new_node(view.graph, "", "Softmax", [x], {"axis": 0}, 1),
        "LayerNormalization": view.new_node(view.graph, "", "LayerNormalization", [x], {"axis": -1}, 1),
    }
    with pytest.raises(RewriteDeclined, match="refuses the rewrite's inputs"):  # a [4, 4] scale for a [4] norm
        view.new_node(view.graph, "", "LayerNormalization", [x, w], {"axis": -1}, 1)
    for op, node in built.items():
        if op == "Gemm":
            assert view.op_key(node) == ("", "Gemm") and view.attr(node, "alpha") == 2.0
        else:
            assert view.op_key(node) == ("", op)
    assert view.attr(built["Gelu"], "approximate") == "tanh"
    view.discard_pending()
    assert all(getattr(n, "_erased", False) for n in built.values())
    gm.graph.lint()


def test_training_applies_only_rewrites_with_gradients() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(16)
            self.fc = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
            h = self.ln(x + r)  # Add + LayerNorm: graphopt.SkipLayerNorm, no gradient formula
            h = self.fc(h)
            return 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * torch.pow(h, 3.0))))  # tanh GELU

    torch.manual_seed(0)
    model = Block()
    x, r = torch.randn(2, 5, 16, requires_grad=True), torch.randn(2, 5, 16)
    model(x, r).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    torch.compile(model, backend="graphopt", options={"inductor": False})(x, r).sum().backward()
    for got, want in zip([p.grad for p in model.parameters()] + [x.grad], expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    report = graphopt.last_report()
    applied = _applied(report)
    assert applied.get("FuseGeluTanh") == 1  # aten.gelu has a derivative
    assert "FuseSkipLayerNorm" not in applied
    assert any("no lowering for graphopt.SkipLayerNorm" in m.reason for m in report.rules["FuseSkipLayerNorm"].near_misses)
    assert torch_lowering.custom_op_problem("graphopt::layer_norm", training=True) is not None


def test_options_select_rules_and_write_indexed_reports(tmp_path: Path) -> None:
    model = ConvBnCast().eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        out = torch.compile(model, backend="graphopt",
                            options={"inductor": False, "disable": ["FoldConvBatchNorm", "FoldConvBatchNormComputedWeights"],
                                     "report": str(tmp_path / "r.json")})(x)
        torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
        report = graphopt.last_report()
        assert "FoldConvBatchNorm" not in report.rules and report.after.ops["BatchNormalization"] == 1
        torch._dynamo.reset()
        torch.compile(model, backend="graphopt", options={"inductor": False, "rules": ["DropNoOpCast"], "report": str(tmp_path / "s-{index}.json")})(x)
    assert set(graphopt.last_report().rules) == {"DropNoOpCast"}
    first, second = json.loads((tmp_path / "r.0.json").read_text()), json.loads((tmp_path / "s-1.json").read_text())
    assert first["schema"] == "graphopt.report" and first["target"] == "torch"
    assert [r["name"] for r in second["rules"]] == ["DropNoOpCast"]
    assert len(torch_reports()) == 2 and graphopt.torch_reports() == torch_reports()
    schema = json.loads((REPO / "graphopt" / "report" / "schema.json").read_text())
    jsonschema.validate(first, schema)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"rules": ["NoSuchRule"]}, "unknown rule 'NoSuchRule'"),
        ({"disable": ["NoSuchRule"]}, "unknown rule 'NoSuchRule'"),
        ({"inductr": False}, "unknown graphopt option 'inductr'"),
        ({"inductor": "no"}, "'inductor' takes True or False"),
        ({"layout": "nhcw"}, "'layout' takes one of auto, nhwc, nchw"),
        ({"kernels": "some"}, "'kernels' takes 'auto', 'all' or 'none'"),
    ],
)
def test_bad_options_fail_with_a_clear_message(options: dict[str, Any], message: str) -> None:
    compiled = torch.compile(nn.Linear(4, 4), backend="graphopt", options=options)
    with pytest.raises(Exception, match=message):
        compiled(torch.randn(2, 4))
    with pytest.raises(GraphoptError, match=message):  # the same error, outside torch.compile
        _rule_set(TorchOptions.parse(options))
    assert issubclass(RuleNameError, GraphoptError)


def test_modes_and_kernel_policy() -> None:
    assert TorchOptions.parse(None, "max-autotune").mode == "max-autotune"
    assert TorchOptions.parse({"mode": "reduce-overhead"}).mode == "reduce-overhead"
    torch._dynamo.reset()
    model = nn.Linear(4, 4)
    torch.compile(model, backend="graphopt", mode="max-autotune-no-cudagraphs")  # accepted (used once it runs)
    with pytest.raises(GraphoptError, match="mode 'fastest'"):
        TorchOptions.parse(None, "fastest")
    # With inductor, custom kernels only where CUDA graphs replay them (no Python dispatch per call).
    assert TorchOptions.parse({"inductor": True}).kernel_policy() == "none"
    assert TorchOptions.parse({"inductor": True, "mode": "reduce-overhead"}).kernel_policy() == "inductor"
    assert TorchOptions.parse({"inductor": True, "kernels": "all"}).kernel_policy() == "all"
    assert TorchOptions.parse({"inductor": False}).kernel_policy() == "all"
    # With inductor, "auto" keeps only the custom kernels measured faster than inductor's code.
    with_inductor = torch_lowering.torch_target(kernels="inductor")
    assert set(with_inductor.lowerings) - set(torch_lowering.PREFERRED_OVER_INDUCTOR) == {
        op for op, low in torch_lowering.GRAPHOPT.items() if not low.custom_ops or low.aten is not None
    }
    # ... the ops with an ATen-only form run as it (no custom op: inductor fuses it with its neighbours).
    assert {op for op in with_inductor.lowerings if torch_lowering.uses_aten_form(with_inductor, op)} == {
        "RotaryEmbedding", "RMSNorm", "SkipRMSNorm", "SwiGLU", "GatedGelu"} - set(torch_lowering.PREFERRED_OVER_INDUCTOR)
    assert "SkipLayerNorm" in torch_lowering.torch_target(kernels="all").lowerings
    # mode="reduce-overhead" without inductor means CUDA graphs; on CPU inputs that is reported, not fatal.
    model = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    torch.testing.assert_close(torch.compile(model, backend="graphopt", options={"inductor": False, "mode": "reduce-overhead"})(x), model(x))
    assert any("CUDA graphs" in w for w in graphopt.last_report().warnings)


def test_backend_is_found_through_the_entry_point_without_importing_graphopt() -> None:
    code = (
        "import sys, torch\n"
        "assert 'graphopt' not in sys.modules\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())\n"
        "x = torch.randn(2, 8)\n"
        "with torch.no_grad():\n"
        "    out = torch.compile(m, backend='graphopt', options={'inductor': False})(x)\n"
        "assert torch.allclose(out, m(x), atol=1e-6)\n"
        "import graphopt\n"
        "print(graphopt.last_report().target, len(graphopt.torch_reports()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["torch", "1"]


class AttentionBlock(nn.Module):
    """SDPA + residual LayerNorm, with a graph break in the middle."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.ln = nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(2, 6, 3, 4, 8).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 6, 32)
        torch._dynamo.graph_break()
        return self.ln(a + x)


def test_inductor_takes_the_leftovers_with_no_more_graph_breaks() -> None:
    torch.manual_seed(0)
    model = AttentionBlock().eval()
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        expected = model(x)
        torch._dynamo.utils.counters.clear()
        got = torch.compile(model, backend="graphopt", options={"kernels": "all"})(x)
        graphopt_breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
        applied = [_applied(r) for r in torch_reports()]
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        inductor = torch.compile(model, backend="inductor")(x)
        inductor_breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(inductor, expected, atol=1e-5, rtol=1e-5)
    assert inductor_breaks >= 1 and graphopt_breaks <= inductor_breaks
    assert applied[0]["FuseScaledDotProductAttention"] == 1 and applied[1]["FuseSkipLayerNorm"] == 1
    assert all(r.times_s["leftovers"] > 0 for r in torch_reports())


class _WrittenOutLayerNorm(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.g, self.b = nn.Parameter(torch.randn(n)), nn.Parameter(torch.randn(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x - x.mean(-1, keepdim=True)
        return d / torch.sqrt((d * d).mean(-1, keepdim=True) + 1e-5) * self.g + self.b


def test_inductor_gets_cuda_graphs_and_the_frozen_constants_as_static_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """mode="reduce-overhead" reaches inductor as CUDA graphs, and the constants graphopt froze
    (lifted into inputs by aot_autograd) are static: CUDA graphs would copy every non-static
    input into graph-owned memory on every replay (BERT-base: all 200 weights)."""
    import torch._inductor.compile_fx as inductor_compile_fx

    seen: list[tuple[int, list[int], bool]] = []
    real = inductor_compile_fx.compile_fx_inner

    def spy(gm: Any, inputs: Any, **kwargs: Any) -> Any:
        seen.append((len(inputs), list(kwargs.get("static_input_idxs", ())), bool(kwargs.get("cudagraphs"))))
        return real(gm, inputs, **kwargs)

    monkeypatch.setattr(inductor_compile_fx, "compile_fx_inner", spy)
    # (a LayerNorm written out, which graphopt fuses: a graph it leaves alone goes to inductor untraced)
    model = nn.Sequential(nn.Linear(8, 8), _WrittenOutLayerNorm(8), nn.Linear(8, 8)).eval()
    x = torch.randn(2, 8)
    # The config modules' own patch(): monkeypatch's undo deletes these entries, which breaks
    # every later compile in the process ("enable_autograd_cache does not exist").
    no_caches = (torch._functorch.config.patch(enable_autograd_cache=False),  # a cache hit skips inner_compile
                 torch._inductor.config.patch(fx_graph_cache=False))
    with torch.no_grad(), no_caches[0], no_caches[1]:
        for mode, cuda_graphs in (("reduce-overhead", True), (None, False)):
            torch._dynamo.reset()
            torch.testing.assert_close(torch.compile(model, backend="graphopt", options={"mode": mode})(x), model(x))
            inputs, static, cudagraphs = seen[-1]
            assert cudagraphs is cuda_graphs
            assert inputs == 7 and static == list(range(6)), (inputs, static)  # 6 constants, then x
    assert len(seen) == 2


def test_constant_array_of_a_frozen_parameter() -> None:
    model = nn.Conv2d(2, 2, 1).eval()

    def run(x: torch.Tensor) -> torch.Tensor:
        return model(x)

    with torch.no_grad():
        torch.compile(run, backend="graphopt", options={"inductor": False})(torch.randn(1, 2, 3, 3))
    graph = last_graph()
    view = FxView(graph)
    conv = next(n for n in view.nodes(view.graph) if view.op_key(n) == ("", "Conv"))
    weight = view.inputs(conv)[1]
    assert view.is_const(weight)
    np.testing.assert_array_equal(view.const_array(weight), model.weight.detach().numpy())


def test_sdpa_rule_keeps_causality_scale_and_grouped_heads() -> None:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)

    q, k, v = torch.randn(2, 4, 7, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    with torch.no_grad():
        got = torch.compile(fn, backend="graphopt", options={"inductor": False})(q, k, v)
    torch.testing.assert_close(got, fn(q, k, v), atol=1e-5, rtol=1e-5)
    assert _applied(graphopt.last_report()) == {"FuseScaledDotProductAttention": 1}
    call = next(n for n in last_graph().graph.nodes if n.op == "call_function" and "graphopt.attention" in str(n.target))
    assert call.args[4:] == (True, 0.3)  # is_causal, scale


def test_sdpa_rule_is_refused_on_onnx_targets() -> None:
    """One library for both graph kinds: on ONNX the standard Attention already is the fused op."""
    import onnx
    from onnx import TensorProto, helper

    shape = [1, 2, 4, 8]
    nodes = [helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    for target in ("onnx", "ort-cpu"):
        optimized, report = graphopt.optimize(onnx.ModelProto.FromString(model.SerializeToString()), target=target, enable=["FuseScaledDotProductAttention"])
        stats = report.rules["FuseScaledDotProductAttention"]
        assert stats.matches == 1 and stats.applications == 0
        assert "no lowering for graphopt.ScaledDotProductAttention" in stats.near_misses[0].reason
        assert [n.op_type for n in optimized.graph.node] == ["Attention"]


def test_benchmark_dry_run(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("torch_compile_benchmark", REPO / "benchmarks" / "torch_compile.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = ["--tiny", "--device", "cpu", "--models", "bert", "--variants", "eager,graphopt", "--warmup", "1", "--iters", "2", "--out", f"{tmp_path}/"]
    assert bench.main(args) == 0
    data = json.loads((tmp_path / "torch_compile-bert-tiny.json").read_text())
    graphopt_run = data["results"][0]["variants"]["graphopt"]
    assert graphopt_run["status"] == "ok" and graphopt_run["median_ms"] > 0 and graphopt_run["numerics_ok"]
    assert graphopt_run["graphopt"]["rewrites"]["FuseScaledDotProductAttention"] == 2


def test_a_failure_inside_graphopt_falls_back_to_the_traced_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("lowering exploded")

    monkeypatch.setattr(torch_lowering, "lower_neutral_nodes", broken)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    x = torch.randn(2, 8)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="lowering exploded"):
        got = torch.compile(model, backend="graphopt", options={"inductor": False})(x)
        torch.testing.assert_close(got, model(x))
    assert any("runs as dynamo captured it" in w for w in graphopt.last_report().warnings)
    clear_reports()  # the fall-back was the point here
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(Exception, match="lowering exploded"):
        torch.compile(model, backend="graphopt", options={"inductor": False, "strict": True})(x)


def test_state_the_graph_writes_is_not_frozen() -> None:
    """A training-mode BatchNorm under no_grad updates its running stats: they stay inputs."""
    compiled_bn, eager_bn = nn.BatchNorm1d(4).train(), nn.BatchNorm1d(4).train()
    x = torch.randn(8, 4)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(torch.compile(compiled_bn, backend="graphopt", options={"inductor": False})(x), eager_bn(x))
    torch.testing.assert_close(compiled_bn.running_mean, eager_bn.running_mean)
    torch.testing.assert_close(compiled_bn.running_var, eager_bn.running_var)
    assert int(compiled_bn.num_batches_tracked) == 2
    assert "2 parameters and buffers frozen" in graphopt.last_report().warnings[0]  # weight and bias only
