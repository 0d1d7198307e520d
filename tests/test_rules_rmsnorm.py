"""Golden tests for the RMSNorm rules of normalization.pdll: decomposed RMSNorm -> graphopt.RMSNorm
(SimplifiedLayerNormalization on onnxruntime) or RMSNormalization (opset >= 23), Add + RMSNorm -> SkipRMSNorm."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from rule_testing import SKIP_NORM_WINS, TensorProto, assert_same_outputs, helper, init, make_model, op_types, rand, rewrites
from rule_testing import optimize_with as _optimize_with

# On ort-cpu a fused residual norm is a decision (graphopt/passes/skip_norm.py) that the measured
# table mostly answers 'unfused'; these tests check the rules' output, so they optimize with a table
# in which the fused op wins (tests/test_skip_norm_decision.py checks the decision).
optimize_with = functools.partial(_optimize_with, cost_table=SKIP_NORM_WINS)

F = TensorProto.FLOAT
H = 8
MS = "com.microsoft"
_RULES = ["FuseRMSNorm"]


def _ops(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in model.graph.node]


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def decomposed_rms_norm(
    opset: int = 17,
    recip: str = "reciprocal",
    axes: int = -1,
    eps_const: bool = True,
    exponent: float = 2.0,
    axes_as_input: bool | None = None,
    skip: bool = False,
    add_escapes: bool = False,
) -> onnx.ModelProto:
    """x [N, 4, H] -> Pow 2 -> ReduceMean -> Add eps -> Sqrt -> reciprocal -> * x -> * weight, as exporters write LlamaRMSNorm."""
    as_input = opset >= 18 if axes_as_input is None else axes_as_input
    inits = [init("weight", rand(H)), init("two", np.array(exponent, np.float32))]
    if eps_const:
        inits.append(init("eps", np.array(1e-6, np.float32)))
    if as_input:
        inits.append(init("axes", np.array([axes], np.int64)))
    nodes = []
    if skip:
        nodes.append(helper.make_node("Add", ["a", "b"], ["x"]))
    nodes += [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["var"], keepdims=1)
        if as_input
        else helper.make_node("ReduceMean", ["sq"], ["var"], axes=[axes], keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["std"]),
    ]
    if recip == "reciprocal":
        nodes += [helper.make_node("Reciprocal", ["std"], ["inv"]), helper.make_node("Mul", ["x", "inv"], ["norm"])]
    elif recip == "div1":
        inits.append(init("one", np.array(1.0, np.float32)))
        nodes += [helper.make_node("Div", ["one", "std"], ["inv"]), helper.make_node("Mul", ["inv", "x"], ["norm"])]
    else:
        nodes.append(helper.make_node("Div", ["x", "std"], ["norm"]))
    nodes.append(helper.make_node("Mul", ["weight", "norm"], ["y"]))
    if skip:
        inputs = [helper.make_tensor_value_info("a", F, ["N", 4, H]), helper.make_tensor_value_info("b", F, ["N", 4, H])]
    else:
        inputs = [helper.make_tensor_value_info("x", F, ["N", 4, H])]
    if not eps_const:
        inputs.append(helper.make_tensor_value_info("eps", F, []))
    outputs = [helper.make_tensor_value_info("y", F, None)]
    if add_escapes:
        outputs.append(helper.make_tensor_value_info("x", F, None))
    model = make_model(nodes, inputs, outputs, inits, opset=opset)
    if opset >= 23:
        model.ir_version = 11
    return model


@pytest.mark.parametrize("recip", ["reciprocal", "div1", "div"])
@pytest.mark.parametrize("opset", [17, 18])
def test_rms_norm_fuses_on_ort_cpu(recip: str, opset: int) -> None:
    model = decomposed_rms_norm(opset=opset, recip=recip)
    optimized, report = optimize_with(model, _RULES, target="ort-cpu")
    assert rewrites(report, "FuseRMSNorm") == 1
    assert _ops(optimized) == [("", "SimplifiedLayerNormalization")]
    attrs = _attrs(optimized.graph.node[0])
    assert attrs["axis"] == -1
    assert attrs["epsilon"] == pytest.approx(1e-6)
    assert list(optimized.graph.node[0].input) == ["x", "weight"]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


def test_rms_norm_on_ort_cuda_emits_simplified_layer_normalization() -> None:
    optimized, report = optimize_with(decomposed_rms_norm(), _RULES, target="ort-cuda")
    assert rewrites(report, "FuseRMSNorm") == 1
    assert _ops(optimized) == [("", "SimplifiedLayerNormalization")]


@pytest.mark.parametrize("recip", ["reciprocal", "div1", "div"])
def test_rms_norm_at_opset_23_becomes_rms_normalization_for_plain_onnx(recip: str) -> None:
    model = decomposed_rms_norm(opset=23, recip=recip)
    optimized, report = optimize_with(model, _RULES, target="onnx")
    # graphopt.RMSNorm has no lowering on plain ONNX: the rule's second replacement applies.
    assert rewrites(report, "FuseRMSNorm") == 1
    assert report.rules["FuseRMSNorm"].rewrites[0].added == ["RMSNormalization"]
    assert _ops(optimized) == [("", "RMSNormalization")]
    attrs = _attrs(optimized.graph.node[0])
    assert attrs["axis"] == -1
    assert attrs["epsilon"] == pytest.approx(1e-6)
    onnx.checker.check_model(optimized, full_check=True)
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)  # onnxruntime runs opset-23 RMSNormalization


def test_rms_norm_at_opset_23_on_ort_cpu_prefers_simplified_layer_normalization() -> None:
    model = decomposed_rms_norm(opset=23)
    optimized, report = optimize_with(model, _RULES, target="ort-cpu")
    assert rewrites(report, "FuseRMSNorm") == 1
    assert _ops(optimized) == [("", "SimplifiedLayerNormalization")]
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


def test_rms_norm_with_positive_last_axis_fuses() -> None:
    model = decomposed_rms_norm(axes=2)
    optimized, report = optimize_with(model, _RULES, target="ort-cpu")
    assert rewrites(report, "FuseRMSNorm") == 1
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


def test_rms_norm_below_opset_23_is_not_fused_for_plain_onnx() -> None:
    model = decomposed_rms_norm(opset=17)
    optimized, report = optimize_with(model, _RULES, target="onnx")
    assert rewrites(report, "FuseRMSNorm") == 0
    assert len(optimized.graph.node) == 7
    reasons = [m.reason for m in report.rules["FuseRMSNorm"].near_misses]
    assert any("no lowering" in r for r in reasons) and any("opset is 17" in r for r in reasons)


def test_rms_norm_over_another_axis_does_not_fuse() -> None:
    model = decomposed_rms_norm(axes=1)
    optimized, report = optimize_with(model, _RULES, target="ort-cpu")
    assert rewrites(report, "FuseRMSNorm") == 0
    assert len(optimized.graph.node) == 7
    assert "not only the last one" in report.rules["FuseRMSNorm"].near_misses[0].reason


def test_rms_norm_with_non_constant_eps_does_not_fuse() -> None:
    model = decomposed_rms_norm(eps_const=False)
    optimized, report = optimize_with(model, _RULES, target="ort-cpu")
    assert rewrites(report, "FuseRMSNorm") == 0
    assert len(optimized.graph.node) == 7


def test_rms_norm_with_cube_does_not_fuse() -> None:
    model = decomposed_rms_norm(exponent=3.0)
    optimized, report = optimize_with(model, _RULES, target="ort-cpu")
    assert rewrites(report, "FuseRMSNorm") == 0
    assert len(optimized.graph.node) == 7
    assert "not 2" in report.rules["FuseRMSNorm"].near_misses[0].reason


# --------------------------------------------------------------------------- SkipRMSNorm

_SKIP_RULES = ["FuseRMSNorm", "FuseSkipRMSNorm"]


def test_add_rms_norm_fuses_on_ort_cpu() -> None:
    model = decomposed_rms_norm(skip=True)
    optimized, report = optimize_with(model, _SKIP_RULES, target="ort-cpu")
    assert rewrites(report, "FuseRMSNorm") == 1
    assert rewrites(report, "FuseSkipRMSNorm") == 1
    assert _ops(optimized) == [(MS, "SkipSimplifiedLayerNormalization")]
    node = optimized.graph.node[0]
    assert list(node.input) == ["a", "b", "weight"]
    assert _attrs(node)["epsilon"] == pytest.approx(1e-6)
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


def test_add_rms_norm_on_ort_cuda_emits_skip_simplified_layer_normalization() -> None:
    optimized, report = optimize_with(decomposed_rms_norm(skip=True), _SKIP_RULES, target="ort-cuda")
    assert rewrites(report, "FuseSkipRMSNorm") == 1
    assert _ops(optimized) == [(MS, "SkipSimplifiedLayerNormalization")]


def test_add_rms_norm_at_opset_23_is_not_skip_fused_for_plain_onnx() -> None:
    model = decomposed_rms_norm(opset=23, skip=True)
    optimized, report = optimize_with(model, _SKIP_RULES, target="onnx")
    assert rewrites(report, "FuseSkipRMSNorm") == 0
    assert op_types(optimized) == ["Add", "RMSNormalization"]


def test_add_with_another_user_skip_fuses_keeping_the_sum() -> None:
    model = decomposed_rms_norm(skip=True, add_escapes=True)
    optimized, report = optimize_with(model, _SKIP_RULES, target="ort-cpu")
    assert rewrites(report, "FuseRMSNorm") == 1
    assert rewrites(report, "FuseSkipRMSNorm") == 1
    assert _ops(optimized) == [("com.microsoft", "SkipSimplifiedLayerNormalization")]
    assert len(optimized.graph.node[0].output) == 4 and optimized.graph.node[0].output[3]  # the sum, used elsewhere
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- tiny LLaMA, TorchScript exporter

def _export_tiny_llama(path: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000
    )
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids):  # an explicit mask avoids aten::diff (no ONNX symbolic) in the mask helpers
            return self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits

    ids = torch.randint(0, 1000, (1, 8))
    torch.onnx.export(
        Logits(), (ids,), path, dynamo=False, opset_version=17, input_names=["input_ids"], output_names=["logits"],
        dynamic_axes={"input_ids": {0: "B", 1: "S"}},
    )


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("target", ["ort-cpu", "onnx"])
def test_tiny_llama_rms_norm_fusions(tmp_path, target: str) -> None:
    import graphopt
    from graphopt.verify import verify

    source = str(tmp_path / "llama.onnx")
    _export_tiny_llama(source)
    # every rule: the exporter's no-op Casts to float32 go first, then RMSNorm fuses
    optimized, report = graphopt.optimize(onnx.load(source), target=target, cost_table=SKIP_NORM_WINS)
    rules = ["FuseRMSNorm", "FuseSkipRMSNorm"]
    ops = {(n.domain, n.op_type) for n in optimized.graph.node}
    # 5 RMSNorms (2 per layer + final). Only the last residual Add feeds nothing but
    # its norm; the other three are also the next residual, so their sum stays an output.
    # The first norm reads the embeddings (no residual Add). Opset 17: nothing for plain ONNX.
    if target == "ort-cpu":
        assert {r: rewrites(report, r) for r in rules} == {"FuseRMSNorm": 5, "FuseSkipRMSNorm": 4}
        counts = [(n.domain, n.op_type) for n in optimized.graph.node]
        assert counts.count(("", "SimplifiedLayerNormalization")) == 1
        assert counts.count((MS, "SkipSimplifiedLayerNormalization")) == 4
        assert ("", "Pow") not in ops and ("", "Sqrt") not in ops
    else:
        assert {r: rewrites(report, r) for r in rules} == {r: 0 for r in rules}
    result = verify(source, optimized)
    assert result.passed, result.message


# ---------------------------------------------------------------- half precision, normalized in float32
F16 = TensorProto.FLOAT16


def upcast_rms_norm(opset: int = 17, down: int = F16, source: int = F16, square: str = "pow", inverse: str = "reciprocal") -> onnx.ModelProto:
    """transformers' LlamaRMSNorm on a half-precision input, as torch.onnx writes it:
    Cast(h, float) -> Pow 2 -> ReduceMean -> Add eps -> Sqrt -> Reciprocal -> Mul -> Cast(back) -> Mul weight;
    `square` "mul": Mul(x, x); `inverse` "pow": Pow(var + eps, -0.5) instead of Sqrt, Reciprocal."""
    np_type = {F16: np.float16, F: np.float32}
    weight_type = np_type.get(down, np.float32)
    nodes = [
        helper.make_node("Cast", ["h"], ["x"], to=F),
        helper.make_node("Pow", ["x", "two"], ["sq"]) if square == "pow" else helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["var"], keepdims=1)
        if opset >= 18
        else helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        *([helper.make_node("Sqrt", ["ve"], ["std"]), helper.make_node("Reciprocal", ["std"], ["inv"])] if inverse == "reciprocal"
          else [helper.make_node("Pow", ["ve", "minus_half"], ["inv"])]),
        helper.make_node("Mul", ["x", "inv"], ["norm"]),
        helper.make_node("Cast", ["norm"], ["norm_low"], to=down),
        helper.make_node("Mul", ["weight", "norm_low"], ["y"]),
    ]
    inits = [init("weight", (rand(H, positive=True) + 0.5).astype(weight_type)), init("two", np.array(2.0, np.float32)),
             init("eps", np.array(1e-6, np.float32)), init("minus_half", np.array(-0.5, np.float32))]
    if opset >= 18:
        inits.append(init("axes", np.array([-1], np.int64)))
    model = make_model(nodes, [helper.make_tensor_value_info("h", source, ["N", 4, H])], [helper.make_tensor_value_info("y", down, None)],
                       inits, opset=opset)
    if opset >= 23:
        model.ir_version = 11
    return model


@pytest.mark.parametrize("square, inverse", [("pow", "reciprocal"), ("mul", "reciprocal"), ("mul", "pow")])
@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_half_precision_rms_norm_with_its_float32_upcast_fuses(target: str, square: str, inverse: str) -> None:
    model = upcast_rms_norm(square=square, inverse=inverse)
    optimized, report = optimize_with(model, ["FuseRMSNormUpcast"], target=target)
    assert rewrites(report, "FuseRMSNormUpcast") == 1
    assert _ops(optimized) == [("", "SimplifiedLayerNormalization")]
    assert list(optimized.graph.node[0].input) == ["h", "weight"]
    assert _attrs(optimized.graph.node[0])["epsilon"] == pytest.approx(1e-6)
    if target == "ort-cpu":  # the CPU provider has the float16 kernel: same outputs within fp16's precision
        assert_same_outputs(model, optimized, rtol=2e-3, atol=2e-3)


def test_half_precision_rms_norm_at_opset_23_becomes_rms_normalization_for_plain_onnx() -> None:
    model = upcast_rms_norm(opset=23)
    optimized, report = optimize_with(model, ["FuseRMSNormUpcast"], target="onnx")
    assert rewrites(report, "FuseRMSNormUpcast") == 1
    assert _ops(optimized) == [("", "RMSNormalization")]
    assert_same_outputs(model, optimized, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("down, source", [(F, F16), (F16, F)], ids=["not-cast-back", "float32-input"])
def test_rms_norm_upcast_that_does_not_return_to_the_input_type_does_not_fuse(down: int, source: int) -> None:
    # Cast back to float32 (the norm's output is float32, not h's type), or an input already float32.
    optimized, report = optimize_with(upcast_rms_norm(down=down, source=source), ["FuseRMSNormUpcast"], target="ort-cpu")
    assert rewrites(report, "FuseRMSNormUpcast") == 0
    assert "SimplifiedLayerNormalization" not in op_types(optimized)


def test_half_precision_rms_norm_fuses_on_the_torch_path() -> None:
    torch = pytest.importorskip("torch")
    import graphopt

    class HalfRMSNorm(torch.nn.Module):  # transformers' LlamaRMSNorm
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(H) + 0.5)

        def forward(self, h):
            x = h.to(torch.float32)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.weight * x.to(h.dtype)

    model = HalfRMSNorm().half().eval()
    h = torch.randn(2, 4, H, dtype=torch.float16)
    with torch.no_grad():
        want = model(h)
        got = torch.compile(model, backend="graphopt", options={"inductor": False})(h)
    report = graphopt.last_report()
    assert rewrites(report, "FuseRMSNormUpcast") == 1
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
