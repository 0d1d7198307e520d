"""The engine never crashes on a valid model (issue 12).

* A rewrite whose new nodes would read a value computed from what they replace
  (a cycle) is declined before the commit and shows up as a near-miss.
* The skip-norm rules state what they need: the norm's scale and shift are not
  computed from the residual sum the fused op returns.
* A bug in one rule (its matcher, a helper, its rewrite) is declined at that site
  with a warning naming rule and node; `--strict` makes it fatal.
* Dims that exporters write as expressions ("past + seq") equal the same expression
  derived from the graph, so attention fuses on decoders with a KV cache.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from rule_testing import assert_same_outputs, helper, init, make_model, op_types, rand, rewrites

import graphopt
from graphopt.errors import GraphoptError
from graphopt.ir.symbolic import dim_from_text

H = 8
F = TensorProto.FLOAT


def _ln(x: str, out: str, gamma: str, beta: str) -> onnx.NodeProto:
    return helper.make_node("LayerNormalization", [x, gamma, beta], [out], axis=-1, epsilon=1e-5)


def _adaptive_scale(sum_name: str, out: str) -> list[onnx.NodeProto]:
    """A LayerNorm scale computed from the residual sum itself (as adaptive norms do)."""
    return [helper.make_node("ReduceMean", [sum_name, "axes01"], [out + "_raw"], keepdims=0),
            helper.make_node("Add", [out + "_raw", "one"], [out])]


def residual_block_model(structure: str) -> onnx.ModelProto:
    """Blocks whose residual sum feeds both a LayerNorm (with a scale computed from that
    sum) and the next block; the three structures of the real exports that crashed."""
    nodes = [_ln("x", "h0", "g0", "b0"), helper.make_node("MatMul", ["h0", "w0"], ["f0"])]
    inputs = [helper.make_tensor_value_info("x", F, [2, 3, H])]
    outputs = []
    inits = [init("g0", rand(H)), init("b0", rand(H)), init("w0", rand(H, H)), init("w1", rand(H, H)),
             init("b1", rand(H)), init("axes01", np.array([0, 1], np.int64)), init("one", np.ones(H, np.float32))]
    if structure == "pre-ln-encoder":
        nodes += [helper.make_node("Add", ["x", "f0"], ["s"])]
    elif structure == "kv-cache-decoder":
        # the block's key is concatenated to the cache, read by the next block
        inputs.append(helper.make_tensor_value_info("past", F, [2, 4, H]))
        nodes += [helper.make_node("Concat", ["past", "f0"], ["present"], axis=1),
                  helper.make_node("ReduceMean", ["present", "axis1"], ["ctx"], keepdims=1),
                  helper.make_node("Add", ["f0", "ctx"], ["attn"]),
                  helper.make_node("Add", ["x", "attn"], ["s"])]
        inits.append(init("axis1", np.array([1], np.int64)))
        outputs.append(helper.make_tensor_value_info("present", F, [2, 7, H]))
    elif structure == "parallel-residual":
        # attention and MLP branches read the same norm; x + attn + mlp is the residual
        nodes += [helper.make_node("MatMul", ["h0", "w1"], ["m0"]), helper.make_node("Relu", ["m0"], ["m1"]),
                  helper.make_node("Add", ["f0", "m1"], ["both"]), helper.make_node("Add", ["both", "x"], ["s"])]
    else:
        raise ValueError(structure)
    nodes += _adaptive_scale("s", "g1")
    nodes += [_ln("s", "h1", "g1", "b1"), helper.make_node("MatMul", ["h1", "w1"], ["f1"]),
              helper.make_node("Add", ["s", "f1"], ["y"])]  # the sum feeds the next block
    outputs.insert(0, helper.make_tensor_value_info("y", F, [2, 3, H]))
    return make_model(nodes, inputs, outputs, inits, opset=18)


@pytest.mark.parametrize("structure", ["pre-ln-encoder", "kv-cache-decoder", "parallel-residual"])
@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_skip_norm_never_reads_its_own_sum(structure: str, target: str) -> None:
    # On the code before this fix, these raised "Graph contains a cycle" from the commit.
    model = residual_block_model(structure)
    optimized, report = graphopt.optimize(model, target=target)
    onnx.checker.check_model(optimized)
    stats = report.rules["FuseSkipLayerNorm"]
    reasons = [m.reason for m in stats.near_misses]
    assert any("NotComputedFrom" in r and "computed from the sum" in r for r in reasons), reasons
    # the norm with the adaptive scale stays a LayerNormalization; the first one has no residual Add
    assert "LayerNormalization" in op_types(optimized)
    if target == "ort-cpu":
        assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-5)


_CYCLE_RULE = """
// A deliberately careless user rule: it replaces the residual sum with an Add that reads
// `g`, which the model computes from that very sum.
Pattern CarelessRewrite {
  let s = shared op<Add>(a, b);
  let out = op<Mul>(s, g);
  rewrite out with {
    let n = op<Add>(a, g);
    replace s with n;
    replace out with op<Mul>(n, b);
  };
}
"""


def _cycle_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]),
             helper.make_node("Relu", ["s"], ["g"]),
             helper.make_node("Mul", ["s", "g"], ["out"])]
    vi = [helper.make_tensor_value_info(n, F, [4]) for n in ("a", "b")]
    return make_model(nodes, vi, [helper.make_tensor_value_info("out", F, [4])])


def test_driver_declines_a_rewrite_that_would_create_a_cycle(tmp_path: Path) -> None:
    (tmp_path / "careless.pdll").write_text(_CYCLE_RULE)
    model = _cycle_model()
    optimized, report = graphopt.optimize(model, patterns=[str(tmp_path)], enable=["CarelessRewrite"])
    stats = report.rules["CarelessRewrite"]
    assert stats.matches == 1 and stats.applications == 0
    (miss,) = stats.near_misses
    assert miss.reason.startswith("would create a cycle"), miss.reason
    assert "s" in miss.reason
    assert op_types(optimized) == ["Add", "Relu", "Mul"]  # untouched
    onnx.checker.check_model(optimized)
    assert_same_outputs(model, optimized)


def _break_builtin_helper(monkeypatch: pytest.MonkeyPatch, kind: str, name: str, error: BaseException) -> None:
    """Make one of graphopt's own native helpers raise (as a bug in it would)."""
    import dataclasses

    from graphopt.api import builtin_rules
    from graphopt.pattern import native

    builtin_rules()  # registered

    def broken(*_args: object) -> None:
        raise error

    key = (kind, name)
    monkeypatch.setitem(native._REGISTRY, key, dataclasses.replace(native._REGISTRY[key], fn=broken))


def _two_layer_norms() -> onnx.ModelProto:
    """Two decomposed LayerNorms: FuseLayerNorm's rewrite helper ScalarOf runs at both."""
    nodes: list[onnx.NodeProto] = []
    for i, (x, y) in enumerate((("x", "h"), ("h", "y"))):
        nodes += [
            helper.make_node("ReduceMean", [x], [f"m{i}"], axes=[-1], keepdims=1),
            helper.make_node("Sub", [x, f"m{i}"], [f"d{i}"]),
            helper.make_node("Mul", [f"d{i}", f"d{i}"], [f"sq{i}"]),
            helper.make_node("ReduceMean", [f"sq{i}"], [f"v{i}"], axes=[-1], keepdims=1),
            helper.make_node("Add", [f"v{i}", "eps"], [f"ve{i}"]),
            helper.make_node("Sqrt", [f"ve{i}"], [f"s{i}"]),
            helper.make_node("Div", [f"d{i}", f"s{i}"], [f"n{i}"]),
            helper.make_node("Mul", [f"n{i}", "g"], [f"ng{i}"]),
            helper.make_node("Add", [f"ng{i}", "b"], [y]),
        ]
    inits = [init("eps", np.array(1e-5, np.float32)), init("g", rand(H)), init("b", rand(H))]
    return make_model(nodes, [helper.make_tensor_value_info("x", F, [2, 3, H])], [helper.make_tensor_value_info("y", F, [2, 3, H])],
                      inits, opset=17)


@pytest.mark.parametrize(("kind", "name", "stage"), [("Constraint", "IsMeanOverLastAxis", "matching"), ("Rewrite", "ScalarOf", "rewriting")])
def test_a_failing_builtin_rule_is_skipped_with_a_warning(monkeypatch: pytest.MonkeyPatch, kind: str, name: str, stage: str) -> None:
    _break_builtin_helper(monkeypatch, kind, name, ZeroDivisionError("helper bug"))
    model = _two_layer_norms()
    optimized, report = graphopt.optimize(model)
    stats = report.rules["FuseLayerNorm"]
    # both norms, each declined there, once per replacement the rule's `first {...}` offers (LayerNormalization, graphopt.LayerNorm)
    assert stats.errors == 4 and stats.applications == 0
    warnings = [w for w in report.warnings if "FuseLayerNorm at" in w]  # not FuseLayerNormUnscaled's, which the helper breaks too
    assert len(warnings) == 4 and all(f"failed while {stage}" in w and "ZeroDivisionError" in w for w in warnings), warnings
    assert report.to_dict()["rules"] and any(r["errors"] == 4 for r in report.to_dict()["rules"])
    assert_same_outputs(model, optimized)


def test_strict_makes_a_failing_builtin_rule_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    _break_builtin_helper(monkeypatch, "Rewrite", "ScalarOf", KeyError("rewrite bug"))
    with pytest.raises(GraphoptError, match=r"FuseLayerNorm at .* failed while rewriting"):
        graphopt.optimize(_two_layer_norms(), strict=True)


_CLI_WITH_BROKEN_HELPER = """
import dataclasses, sys
from graphopt.api import builtin_rules
from graphopt.pattern import native
builtin_rules()
entry = native._REGISTRY[("Rewrite", "ScalarOf")]
def broken(*args):
    raise KeyError("rewrite bug")
native._REGISTRY[("Rewrite", "ScalarOf")] = dataclasses.replace(entry, fn=broken)
from graphopt.cli import main
sys.argv = ["graphopt", *sys.argv[1:]]
main()
"""


def test_cli_skips_a_failing_builtin_rule_and_strict_is_one_error_line(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(_two_layer_norms(), src)
    script = tmp_path / "run.py"
    script.write_text(_CLI_WITH_BROKEN_HELPER)
    lenient = subprocess.run([sys.executable, str(script), "optimize", str(src), "-o", str(tmp_path / "o.onnx")], capture_output=True, text=True)
    assert lenient.returncode == 0, lenient.stderr
    assert "FuseLayerNorm" in lenient.stdout + lenient.stderr and "failed while rewriting" in lenient.stdout + lenient.stderr
    strict_out = tmp_path / "strict.onnx"
    strict = subprocess.run([sys.executable, str(script), "optimize", str(src), "-o", str(strict_out), "--strict"], capture_output=True, text=True)
    assert strict.returncode == 2
    assert "Traceback" not in strict.stderr
    lines = [line for line in strict.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error:") and "FuseLayerNorm" in lines[-1], strict.stderr
    assert not strict_out.exists()


@pytest.mark.parametrize(("text", "expected"), [
    ("batch", "batch"), ("unk__4", "unk__4"), ("past + seq", "past + seq"), ("2*seq", "2*seq"),
    ("(s0 + 1)//2", "floor(s0/2 + 1/2)"), ("s0 - 1", "s0 - 1"),
])
def test_exporter_dim_expressions_are_expressions(text: str, expected: str) -> None:
    assert str(dim_from_text(text)) == expected


def test_dim_text_is_never_evaluated() -> None:
    # Dim names come from the model: anything that is not plain arithmetic stays one opaque symbol.
    for hostile in ("__import__('os')", "a b", "x+", "lambda: 1", "1e9**1e9"):
        d = dim_from_text(hostile)
        assert d.is_Symbol and str(d) == hostile
    assert dim_from_text("past + seq") == dim_from_text("past") + dim_from_text("seq")


def test_attention_fuses_when_the_mask_dim_is_written_as_an_expression() -> None:
    # An exporter names the key length "past + seq" on the mask; the same length derived from
    # Concat(past, k) is past + seq: they are one dim, and attention fuses.
    heads, size = 2, 4
    q = helper.make_tensor_value_info("q", F, ["batch", heads, "seq", size])
    k = helper.make_tensor_value_info("k", F, ["batch", heads, "seq", size])
    v = helper.make_tensor_value_info("v", F, ["batch", heads, "seq", size])
    pk = helper.make_tensor_value_info("past_k", F, ["batch", heads, "past", size])
    pv = helper.make_tensor_value_info("past_v", F, ["batch", heads, "past", size])
    mask = helper.make_tensor_value_info("mask", F, ["batch", 1, "seq", "past + seq"])
    nodes = [
        helper.make_node("Concat", ["past_k", "k"], ["kk"], axis=2),
        helper.make_node("Concat", ["past_v", "v"], ["vv"], axis=2),
        helper.make_node("Transpose", ["kk"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vv"], ["o"]),
    ]
    out = helper.make_tensor_value_info("o", F, ["batch", heads, "seq", size])
    model = make_model(nodes, [q, k, v, pk, pv, mask], [out], [init("scale", np.array(size ** -0.5, np.float32))])
    optimized, report = graphopt.optimize(model, target="ort-cpu", enable=["FuseAttention"])
    assert rewrites(report, "FuseAttention") == 1, [m.reason for m in report.rules["FuseAttention"].near_misses]
    shapes = {"q": (2, heads, 3, size), "k": (2, heads, 3, size), "v": (2, heads, 3, size), "past_k": (2, heads, 5, size),
              "past_v": (2, heads, 5, size), "mask": (2, 1, 3, 8)}
    assert_same_outputs(model, optimized, shapes=shapes, rtol=1e-4, atol=1e-5)
