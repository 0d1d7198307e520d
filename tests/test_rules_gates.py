"""Golden tests for gates.pdll: SwiGLU (refused on every target: no op runs graphopt.SwiGLU
yet) and GeGLU -> graphopt.GeGLU (com.microsoft.BiasSplitGelu, onnxruntime CUDA only)."""

from __future__ import annotations

import importlib.util
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from rule_testing import TensorProto, helper, init, make_model, op_types, optimize_with, rand, rewrites, run

F = TensorProto.FLOAT
MS = "com.microsoft"
D = 16
GEGLU_RULES = ["FuseGeluErf", "FuseGeGLU"]


def _ops(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in model.graph.node]


def _model(nodes, inits, shape, opset: int, extra_inputs=(), extra_outputs=()) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", F, list(shape)), *extra_inputs]
    outputs = [helper.make_tensor_value_info("y", F, None), *extra_outputs]
    model = make_model(nodes, inputs, outputs, inits, opset=opset)
    model.ir_version = 9 if opset < 23 else 11
    return model


# --- FuseSwiGLU --------------------------------------------------------------------------


def swiglu(form: str = "mul", alpha: float = 1.0, up_shape=None) -> onnx.ModelProto:
    """y = silu(x W1) * (x W3), silu as x * Sigmoid(x) or the opset-24 Swish."""
    inits = [init("w1", rand(D, 2 * D)), init("w3", rand(D, 2 * D) if up_shape is None else rand(*up_shape))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["gate"])]
    if form == "mul":
        nodes += [helper.make_node("Sigmoid", ["gate"], ["sg"]), helper.make_node("Mul", ["gate", "sg"], ["act"])]
    else:
        nodes.append(helper.make_node("Swish", ["gate"], ["act"], alpha=alpha))
    if up_shape is None:
        nodes.append(helper.make_node("MatMul", ["x", "w3"], ["up"]))
    else:
        nodes.append(helper.make_node("Identity", ["w3"], ["up"]))
    nodes.append(helper.make_node("Mul", ["act", "up"], ["y"]))
    return _model(nodes, inits, (2, 3, D), 17 if form == "mul" else 24)


@pytest.mark.parametrize("target", ["onnx", "ort-cpu", "ort-cuda"])
def test_swiglu_is_matched_but_refused_on_every_target(target: str) -> None:
    model = swiglu()
    optimized, report = optimize_with(model, ["FuseSwiGLU"], target=target)
    stats = report.rules["FuseSwiGLU"]
    assert stats.matches >= 1 and stats.applications == 0
    assert stats.near_misses[0].reason == f"target {target} has no lowering for graphopt.SwiGLU"
    assert op_types(optimized) == op_types(model)


def test_swiglu_after_silu_fusion_is_matched_and_refused() -> None:
    # FuseSiLU makes graphopt.QuickGelu {alpha = 1}; FuseSwiGLU still recognizes the gate.
    model = swiglu()
    optimized, report = optimize_with(model, ["FuseSiLU", "FuseSwiGLU"], target="ort-cpu")
    assert rewrites(report, "FuseSiLU") == 1
    assert rewrites(report, "FuseSwiGLU") == 0
    assert report.rules["FuseSwiGLU"].matches >= 2  # before and after the SiLU fusion
    assert _ops(optimized) == [("", "MatMul"), (MS, "QuickGelu"), ("", "MatMul"), ("", "Mul")]


def test_swiglu_with_swish_is_matched_and_refused() -> None:
    optimized, report = optimize_with(swiglu("swish"), ["FuseSwiGLU"], target="onnx")
    assert report.rules["FuseSwiGLU"].matches == 1 and rewrites(report, "FuseSwiGLU") == 0
    assert "no lowering for graphopt.SwiGLU" in report.rules["FuseSwiGLU"].near_misses[0].reason


def test_swiglu_negative_cases() -> None:
    _, report = optimize_with(swiglu("swish", alpha=1.702), ["FuseSwiGLU"], target="onnx")
    assert report.rules["FuseSwiGLU"].matches == 0
    assert "SiLU needs 1" in report.rules["FuseSwiGLU"].near_misses[0].reason
    _, report = optimize_with(swiglu(up_shape=(2 * D,)), ["FuseSwiGLU"], target="onnx")  # a broadcast scale, not a gate
    assert report.rules["FuseSwiGLU"].matches == 0
    assert report.rules["FuseSwiGLU"].near_misses[0].reason.startswith("SameStaticShape:")


# --- FuseGeGLU (with or without the bias Add) --------------------------------------------------------------


def geglu(
    d: int = 2560,
    cut: str = "split",
    gelu: str = "std",
    bias: bool = True,
    sizes: tuple[int, int] | None = None,
    gelu_on_first: bool = False,
    approximate: str = "none",
) -> onnx.ModelProto:
    """y = a * gelu(g) with a, g = chunk(x + bias, 2, -1), as diffusers' GEGLU exports."""
    h = d // 2
    opset = 20 if gelu == "std" else 17
    if cut == "split" and sizes is None and opset < 18:
        sizes = (h, h)
    inits = [init("bias", np.linspace(-1, 1, d).astype(np.float32))] if bias else []
    nodes = [helper.make_node("Add", ["x", "bias"], ["xb"])] if bias else [helper.make_node("Identity", ["x"], ["xb"])]
    if cut == "split":
        if sizes is None:
            nodes.append(helper.make_node("Split", ["xb"], ["a", "g"], axis=-1, num_outputs=2))
        else:
            inits.append(init("sizes", np.array(sizes, np.int64)))
            nodes.append(helper.make_node("Split", ["xb", "sizes"], ["a", "g"], axis=2))
    else:
        lo, hi = sizes or (h, h)
        inits += [init("s0", np.array([0], np.int64)), init("s1", np.array([lo], np.int64)),
                  init("s2", np.array([np.iinfo(np.int64).max], np.int64)), init("ax", np.array([-1], np.int64))]
        nodes += [helper.make_node("Slice", ["xb", "s0", "s1", "ax"], ["a"]), helper.make_node("Slice", ["xb", "s1", "s2", "ax"], ["g"])]
    a, g = ("g", "a") if gelu_on_first else ("a", "g")
    if gelu == "std":
        attrs = {} if approximate == "none" else {"approximate": approximate}
        nodes.append(helper.make_node("Gelu", [g], ["gg"], **attrs))
    else:
        inits += [init("one", np.array(1.0, np.float32)), init("half", np.array(0.5, np.float32)), init("sq2", np.array(math.sqrt(2.0), np.float32))]
        nodes += [
            helper.make_node("Div", [g, "sq2"], ["gs"]),
            helper.make_node("Erf", ["gs"], ["ge"]),
            helper.make_node("Add", ["ge", "one"], ["ge1"]),
            helper.make_node("Mul", [g, "ge1"], ["gp"]),
            helper.make_node("Mul", ["gp", "half"], ["gg"]),
        ]
    nodes.append(helper.make_node("Mul", [a, "gg"], ["y"]))
    if not bias:
        nodes = nodes[1:]
        for n in nodes:
            n.input[:] = ["x" if i == "xb" else i for i in n.input]
    return _model(nodes, inits, (1, 2, d), opset)


def _bias_split_gelu_reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """com.microsoft.BiasSplitGelu(x, bias) in numpy (bias_split_gelu_impl.cu): the left half times
    the erf GELU of the right half."""
    from math import erf

    node = next(n for n in model.graph.node if n.op_type == "BiasSplitGelu")
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    xb = x + inits[node.input[1]]
    h = xb.shape[-1] // 2
    left, right = xb[..., :h].astype(np.float64), xb[..., h:].astype(np.float64)
    gelu = right * 0.5 * (1.0 + np.vectorize(erf)(right / math.sqrt(2.0)))
    return (left * gelu).astype(np.float32)


def _check_bias_split_gelu(model: onnx.ModelProto, optimized: onnx.ModelProto) -> None:
    x = rand(1, 2, model.graph.input[0].type.tensor_type.shape.dim[2].dim_value)
    (expected,) = run(model, {"x": x})
    np.testing.assert_allclose(_bias_split_gelu_reference(optimized, x), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("gelu", ["std", "erf"])
@pytest.mark.parametrize("cut, sizes", [("split", None), ("split", (1280, 1280)), ("slice", None)])
def test_bias_geglu_becomes_bias_split_gelu_on_ort_cuda(cut: str, sizes, gelu: str) -> None:
    model = geglu(cut=cut, sizes=sizes, gelu=gelu)
    optimized, report = optimize_with(model, GEGLU_RULES, target="ort-cuda")
    assert rewrites(report, "FuseGeGLU") == 1
    assert _ops(optimized) == [(MS, "BiasSplitGelu")]
    assert list(optimized.graph.node[0].input) == ["x", "bias"]
    _check_bias_split_gelu(model, optimized)


def test_geglu_without_bias_gets_a_zero_bias() -> None:
    model = geglu(bias=False)
    optimized, report = optimize_with(model, GEGLU_RULES, target="ort-cuda")
    assert rewrites(report, "FuseGeGLU") == 1
    assert _ops(optimized) == [(MS, "BiasSplitGelu")]
    bias = next(i for i in optimized.graph.initializer if i.name == optimized.graph.node[0].input[1])
    assert not onnx.numpy_helper.to_array(bias).any()
    _check_bias_split_gelu(model, optimized)


@pytest.mark.parametrize("target, reason", [
    ("ort-cpu", "target ort-cpu has no lowering for graphopt.GeGLU"),
    ("onnx", "target onnx has no lowering for graphopt.GeGLU"),
])
def test_geglu_is_refused_where_no_kernel_runs_it(target: str, reason: str) -> None:
    model = geglu()
    optimized, report = optimize_with(model, GEGLU_RULES, target=target)
    assert rewrites(report, "FuseGeGLU") == 0
    assert report.rules["FuseGeGLU"].near_misses[0].reason == reason
    assert op_types(optimized) == op_types(model)


def test_geglu_with_a_hidden_size_the_cuda_kernel_lacks_is_refused() -> None:
    model = geglu(d=2 * D)
    optimized, report = optimize_with(model, GEGLU_RULES, target="ort-cuda")
    assert rewrites(report, "FuseGeGLU") == 0
    assert "hidden sizes 2560, 5120 and 10240 only, not 32" in report.rules["FuseGeGLU"].near_misses[0].reason
    assert op_types(optimized) == op_types(model)


@pytest.mark.parametrize("case, reason", [
    ("gelu-on-first-half", "output"),
    ("tanh-gelu", "approximate"),
    ("unequal-split", "not two halves"),
    ("unequal-slices", "expected [0, 1280)"),
])
def test_geglu_negative_cases(case: str, reason: str) -> None:
    model = {
        "gelu-on-first-half": lambda: geglu(gelu_on_first=True),
        "tanh-gelu": lambda: geglu(approximate="tanh"),
        "unequal-split": lambda: geglu(sizes=(1000, 1560)),
        "unequal-slices": lambda: geglu(cut="slice", sizes=(1000, 1560)),
    }[case]()
    optimized, report = optimize_with(model, GEGLU_RULES, target="ort-cuda")
    assert rewrites(report, "FuseGeGLU") == 0
    assert reason in report.rules["FuseGeGLU"].near_misses[0].reason, report.rules["FuseGeGLU"].near_misses[0].reason
    assert op_types(optimized) == op_types(model)


# --- end to end: diffusers-style GEGLU and tiny LLaMA exports --------------------------------


@pytest.fixture(scope="module")
def geglu_exports(tmp_path_factory) -> dict[str, Path]:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as tf

    class GEGLU(torch.nn.Module):  # diffusers.models.activations.GEGLU
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(32, 2 * 1280)

        def forward(self, x):
            h, gate = self.proj(x).chunk(2, dim=-1)
            return h * tf.gelu(gate)

    torch.manual_seed(0)
    module, x = GEGLU().eval(), torch.randn(1, 4, 32)
    out = tmp_path_factory.mktemp("geglu")
    paths = {"torchscript": out / "ts.onnx", "dynamo": out / "dy.onnx"}
    torch.onnx.export(module, (x,), str(paths["torchscript"]), dynamo=False, opset_version=17, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "B", 1: "S"}})
    program = torch.onnx.export(module, (x,), dynamo=True, input_names=["x"], output_names=["y"], verbose=False,
                                dynamic_shapes={"x": {0: torch.export.Dim("B"), 1: torch.export.Dim("S")}})
    program.save(str(paths["dynamo"]), external_data=False)
    return paths


# TorchScript: two Slices with computed bounds (folded) and the erf GELU written out (opset 17);
# dynamo: Split {num_outputs = 2} and the opset-20 Gelu.
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_exported_geglu_becomes_bias_split_gelu_on_ort_cuda(geglu_exports: dict[str, Path], exporter: str) -> None:
    import graphopt

    source = onnx.load(geglu_exports[exporter])
    optimized, report = graphopt.optimize(source, target="ort-cuda")
    assert rewrites(report, "FuseGeGLU") == 1
    assert Counter(_ops(optimized)) == Counter({("", "MatMul"): 1, (MS, "BiasSplitGelu"): 1})
    x = rand(2, 3, 32)
    (expected,) = run(source, {"x": x})
    matmul = next(n for n in optimized.graph.node if n.op_type == "MatMul")
    w = onnx.numpy_helper.to_array(next(i for i in optimized.graph.initializer if i.name == matmul.input[1]))
    np.testing.assert_allclose(_bias_split_gelu_reference(optimized, x @ w), expected, rtol=1e-4, atol=1e-4)


def _models():
    name = "graphopt_test_models"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("models.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# LLaMA's MLP: silu(gate_proj(x)) * up_proj(x), one per layer (2 layers). SiLU becomes
# com.microsoft.QuickGelu {alpha = 1}; the SwiGLU around it is recognized and refused.
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_tiny_llama_swiglu_is_recognized_and_silu_fused(exporter: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import graphopt

    models = _models()
    if not hasattr(models, "llama_tiny"):
        pytest.skip("tests/models.py has no llama_tiny")
    source = models.llama_tiny(exporter)
    optimized, report = graphopt.optimize(onnx.load(source), target="ort-cpu")
    assert rewrites(report, "FuseSiLU") == 2
    assert rewrites(report, "FuseSwiGLU") == 0 and report.rules["FuseSwiGLU"].matches >= 2
    assert "no lowering for graphopt.SwiGLU" in report.rules["FuseSwiGLU"].near_misses[0].reason
    ops = Counter(_ops(optimized))
    assert ops[(MS, "QuickGelu")] == 2 and ops[("", "Sigmoid")] == 0


# ----------------------------------------------------------------------------- on FX graphs (the torch backend)
# graphopt.GeGLU runs on torch as graphopt::geglu, any width. Both kinds from one module: tests/both_kinds_cases.py.


def _fx_geglu_rewrites(forward) -> int:
    import torch
    from both_kinds import Case, run_case
    from both_kinds_cases import fn

    outcome = run_case(Case("FuseGeGLU", fn(lambda m, x: forward(x)), lambda: (torch.randn(2, 3, 16),), 0, kinds=("fx",)))
    assert outcome.fx_problem is None, outcome.fx_problem
    return outcome.fx_rewrites


def test_fx_chunked_geglu_of_any_width_is_fused() -> None:
    import torch.nn.functional as F

    assert _fx_geglu_rewrites(lambda x: (lambda h, g: h * F.gelu(g))(*x.chunk(2, -1))) == 1


def test_fx_gelu_of_the_first_half_is_not_geglu() -> None:
    import torch.nn.functional as F

    # BiasSplitGelu's GELU takes the second half: the mirrored form must stay as it is
    assert _fx_geglu_rewrites(lambda x: (lambda h, g: F.gelu(h) * g)(*x.chunk(2, -1))) == 0
