"""The op registry (graphopt/ops/registry.py): every op graphopt emits is declared, the
declarations agree with the targets' own schemas and kernels and with onnxruntime's
shapes, the readers use them, and the private op tables it replaced stay gone."""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
import onnxruntime.capi.onnxruntime_pybind11_state as ort_state
import pytest
from onnx import TensorProto, helper
from rule_testing import make_model

from graphopt.ir.onnx_view import OnnxView
from graphopt.library import BUILTIN_RULES_DIR
from graphopt.match.matcher import Failure, Match, Matcher
from graphopt.ops import registry
from graphopt.ops.lowering import lower_fused_ops
from graphopt.ops.registry import GRAPHOPT_DOMAIN, MS_DOMAIN, InferContext, OpSpec
from graphopt.ops.targets import TARGETS
from graphopt.pattern import load_patterns
from graphopt.pattern.ir import MISSING, AttrMatch, Build, Call, Choose, FirstOf, Let, OpMatch, OpsetChoose, Ref, Replace, Rule, Var

REPO = Path(__file__).resolve().parents[1]
F = TensorProto.FLOAT


# --------------------------------------------------------------------------- what the rules emit


def _builds(expr: Any) -> Iterator[Build]:
    if isinstance(expr, Build):
        yield expr
        for operand in expr.operands:
            yield from _builds(operand)
        for _, value in expr.attrs:
            yield from _builds(value)
    elif isinstance(expr, (Choose, OpsetChoose)):
        for _, branch in expr.branches:
            yield from _builds(branch)
    elif isinstance(expr, FirstOf):
        for option in expr.options:
            yield from _builds(option)
    elif isinstance(expr, Call):
        for arg in expr.args:
            yield from _builds(arg)


def _emitted_graphopt_ops() -> list[tuple[str, Build]]:
    found = []
    for rule in load_patterns(BUILTIN_RULES_DIR):
        for statement in rule.body:
            exprs = [statement.expr] if isinstance(statement, Let) else list(statement.values)
            found.extend((rule.name, b) for e in exprs for b in _builds(e) if b.domain == GRAPHOPT_DOMAIN)
    return found


def test_every_graphopt_op_a_builtin_rule_emits_is_declared_with_what_the_rule_gives_it() -> None:
    emitted = _emitted_graphopt_ops()
    assert len({b.op_type for _, b in emitted}) >= 15  # the walk finds the rules' fused ops
    for rule, build in emitted:
        op = registry.spec(GRAPHOPT_DOMAIN, build.op_type)
        assert op is not None, f"{rule} emits graphopt.{build.op_type}, which graphopt/ops/fused_ops.py does not declare"
        assert len(build.operands) <= len(op.inputs), f"{rule}: graphopt.{build.op_type} takes {len(op.inputs)} inputs"
        required = sum(not i.optional for i in op.inputs)
        assert len(build.operands) >= required, f"{rule}: graphopt.{build.op_type} needs {required} inputs"
        assert build.num_outputs <= len(op.outputs), f"{rule}: graphopt.{build.op_type} has {len(op.outputs)} outputs"
        for name, _ in build.attrs:
            assert op.attribute(name) is not None, f"{rule} sets graphopt.{build.op_type}.{name}, which is not declared"


def test_every_declared_graphopt_op_is_emitted_or_lowered_somewhere() -> None:
    """No stale declarations: each op is emitted by a rule and runs on some target."""
    emitted = {b.op_type for _, b in _emitted_graphopt_ops()}
    for op in registry.graphopt_ops():
        assert op.name in emitted, f"graphopt.{op.name} is declared but no built-in rule emits it"
        assert op.lowerings or op.name in registry.torch_lowerings() or _torch_registers(op.name), f"graphopt.{op.name} runs nowhere"


def _torch_registers(name: str) -> bool:
    import graphopt.ops.torch_lowering  # noqa: F401 - registers the torch lowerings

    return name in registry.torch_lowerings()


# --------------------------------------------------------------------------- lowerings and targets


def test_every_lowering_names_an_op_its_target_runs_and_maps_declared_inputs_and_attributes() -> None:
    for op in registry.graphopt_ops():
        for target, low in op.lowerings.items():
            where = f"graphopt.{op.name} on {target} -> {low.domain or 'onnx'}.{low.op_type}"
            if target == "onnx":
                assert low.domain == "" and onnx.defs.has(low.op_type), where
            else:
                assert low.key in TARGETS[target].kernels, f"{where}: no such kernel"
            for index in low.inputs or ():
                assert index is None or index < len(op.inputs), where
            for name in [*low.rename, *low.explicit]:
                assert op.attribute(name) is not None, f"{where}: {name} is not an attribute of graphopt.{op.name}"
    # what ort-cpu lowers, ort-cuda lowers too, but for FusedGemm: a CPU-only contrib kernel
    assert set(TARGETS["ort-cuda"].lowerings) >= set(TARGETS["ort-cpu"].lowerings) - {"GemmActivation"}
    assert "GemmActivation" not in TARGETS["ort-cuda"].lowerings
    assert TARGETS["ort-cpu"].contract_problem(GRAPHOPT_DOMAIN, "FusedConv", {"activation": "Silu"}, []) is not None
    assert TARGETS["ort-cuda"].contract_problem(GRAPHOPT_DOMAIN, "FusedConv", {"activation": "Tanh"}, []) is not None
    assert TARGETS["ort-cpu"].contract_problem(GRAPHOPT_DOMAIN, "FusedConv", {"activation": "Tanh"}, []) is None


def _target_schemas() -> dict[tuple[str, str], dict[str, tuple[bool, Any]]]:
    """(domain, op) -> attribute -> (required, default or MISSING), from onnxruntime's schemas
    (its contrib ops and its own default-domain ones) and onnx's."""
    found: dict[tuple[str, str], dict[str, tuple[bool, Any]]] = {}
    for schema in ort_state.get_all_operator_schema():
        attrs = {}
        for name, attr in schema.attributes.items():
            default: Any = MISSING
            if attr._default_value:
                proto = onnx.AttributeProto()
                proto.ParseFromString(attr._default_value)
                if proto.name:
                    default = helper.get_attribute_value(proto)
            attrs[name] = (bool(attr.required), default.decode() if isinstance(default, bytes) else default)
        key = (schema.domain, schema.name)
        if key not in found or schema.domain:  # onnxruntime lists every version: the last one wins
            found[key] = attrs
    return found


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=1e-6)
    return bool(a == b)


def test_declared_attribute_defaults_agree_with_the_lowered_ops_schema() -> None:
    """A graphopt op's default is what its target op assumes where the node omits it, or the
    lowering writes it out (Lowering.explicit): QuickGelu's alpha is 1.702, Swish-24's is 1.0."""
    schemas = _target_schemas()
    checked = 0
    for op in registry.graphopt_ops():
        for target, low in op.lowerings.items():
            if target == "onnx":
                schema = onnx.defs.get_schema(low.op_type, onnx.defs.onnx_opset_version(), "")
                target_attrs = {
                    n: (a.required, helper.get_attribute_value(a.default_value) if a.default_value.name else MISSING) for n, a in schema.attributes.items()
                }
            else:
                target_attrs = schemas[low.key]
            for attr in op.attributes:
                for name in low.rename.get(attr.name, (attr.name,)):
                    where = f"graphopt.{op.name}.{attr.name} -> {target} {low.op_type}.{name}"
                    assert name in target_attrs, f"{where}: the target op has no such attribute"
                    required, default = target_attrs[name]
                    if required:
                        assert attr.default is MISSING, f"{where}: required there, defaulted here"
                    elif default is not MISSING and attr.default is not MISSING and attr.name not in low.explicit:
                        assert _same(attr.default, default), f"{where}: declared {attr.default}, the target assumes {default}"
                        checked += 1
    assert checked >= 6
    quick = registry.spec(GRAPHOPT_DOMAIN, "QuickGelu")
    assert quick is not None and "alpha" in quick.lowerings["onnx"].explicit


def test_a_default_the_target_op_does_not_share_is_written_when_lowered() -> None:
    model = ir.serde.deserialize_model(
        make_model([helper.make_node("QuickGelu", ["x"], ["y"], domain=GRAPHOPT_DOMAIN)],
                   [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])], opset=24)
    )
    assert lower_fused_ops(model, TARGETS["onnx"]) == 1
    [node] = list(model.graph)
    assert (node.op_type, node.attributes["alpha"].value) == ("Swish", pytest.approx(1.702))


# --------------------------------------------------------------------------- inference against onnxruntime


def _rand(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


#: graphopt op -> (inputs, attributes, number of outputs) for a one-node model on ort-cpu.
_CASES: dict[str, tuple[list[np.ndarray | None], dict[str, Any], int]] = {
    "MultiHeadAttention": ([_rand(2, 5, 8), _rand(2, 7, 8), _rand(2, 7, 12)], {"num_heads": 2}, 1),
    "Attention": ([_rand(2, 5, 8), _rand(8, 24), _rand(24)], {"num_heads": 2}, 1),
    "FusedConv": ([_rand(1, 3, 9, 9), _rand(4, 3, 3, 3), _rand(4)], {"activation": "Relu", "pads": [1, 1, 0, 0], "strides": [2, 2]}, 1),
    "SkipLayerNorm": ([_rand(2, 3, 8), _rand(2, 3, 8), _rand(8), _rand(8)], {}, 4),
    "SkipRMSNorm": ([_rand(2, 3, 8), _rand(2, 3, 8), _rand(8)], {}, 4),
    "RMSNorm": ([_rand(2, 3, 8), _rand(8)], {}, 1),
    "LayerNorm": ([_rand(2, 3, 8), _rand(8), _rand(8)], {}, 1),
    "Gelu": ([_rand(2, 3, 8)], {}, 1),
    "FastGelu": ([_rand(2, 3, 8), _rand(8)], {}, 1),
    "BiasGelu": ([_rand(2, 3, 8), _rand(8)], {}, 1),
    "QuickGelu": ([_rand(2, 3, 8)], {}, 1),
    "RotaryEmbedding": ([_rand(1, 2, 4, 8), np.arange(4, dtype=np.int64).reshape(1, 4), _rand(16, 4), _rand(16, 4)], {}, 1),
    "GemmActivation": ([_rand(3, 8), _rand(16, 8), _rand(16)], {"activation": "Relu", "transB": 1}, 1),
    # a decode step: q [2, 1, 4 heads * 8], k / v [2, 1, 2 kv heads * 8], past [2, 2, 5, 8], seqlens_k = 5, total = 6
    "GroupQueryAttention": ([_rand(2, 1, 32), _rand(2, 1, 16), _rand(2, 1, 16), _rand(2, 2, 5, 8), _rand(2, 2, 5, 8),
                             np.array([5, 5], np.int32), np.array(6, np.int32)], {"num_heads": 4, "kv_num_heads": 2}, 3),
}


def test_the_inference_cases_cover_every_op_ort_cpu_runs() -> None:
    assert set(_CASES) == set(TARGETS["ort-cpu"].lowerings)


@pytest.mark.parametrize("name", sorted(_CASES))
def test_declared_inference_matches_onnxruntimes_output_shapes(name: str) -> None:
    arrays, attrs, num_outputs = _CASES[name]
    op = registry.spec(GRAPHOPT_DOMAIN, name)
    assert op is not None and op.infer is not None
    names = [f"in{i}" for i in range(len(arrays))]
    outputs = [f"out{i}" for i in range(num_outputs)]
    elem = {np.dtype(np.float32): F, np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32}
    proto = make_model(
        [helper.make_node(name, names, outputs, domain=GRAPHOPT_DOMAIN, **attrs)],
        [helper.make_tensor_value_info(n, elem[a.dtype], a.shape) for n, a in zip(names, arrays, strict=True)],
        [helper.make_tensor_value_info(n, F, None) for n in outputs],
        opset=17,
    )
    model = ir.serde.deserialize_model(proto)
    lower_fused_ops(model, TARGETS["ort-cpu"])
    session = onnxruntime.InferenceSession(ir.serde.serialize_model(model).SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, dict(zip(names, arrays, strict=True)))
    shapes = [list(a.shape) if a is not None else None for a in arrays]
    inferred = op.infer(InferContext(op, lambda i: shapes[i], lambda n: attrs.get(n, MISSING), len(arrays)))
    assert [list(g.shape) for g in got] == inferred[:num_outputs]


def test_symbolic_shapes_read_the_declared_inference() -> None:
    """graphopt.Attention's output width comes from its packed weights, symbolically too."""
    from graphopt.ir.symbolic import SymbolicShapes

    proto = make_model(
        [helper.make_node("Attention", ["x", "w", "b"], ["y"], domain=GRAPHOPT_DOMAIN, num_heads=2)],
        [helper.make_tensor_value_info("x", F, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", F, None)],
        [helper.make_tensor("w", F, [8, 24], _rand(8, 24).reshape(-1).tolist()), helper.make_tensor("b", F, [24], _rand(24).tolist())],
    )
    view = OnnxView(ir.serde.deserialize_model(proto))
    y = next(iter(view.iter_all_nodes())).outputs[0]
    assert [str(d) for d in SymbolicShapes(view).dims(y)] == ["batch", "seq", "8"]


# --------------------------------------------------------------------------- readers


def test_the_matcher_reads_declared_defaults_of_graphopt_ops() -> None:
    """A pattern's literal equal to the declared default matches a node that omits the
    attribute (as onnx's defaults do for standard ops); another value is reported."""
    proto = make_model([helper.make_node("QuickGelu", ["x"], ["y"], domain=GRAPHOPT_DOMAIN, name="q")],
                       [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, None)])
    view = OnnxView(ir.serde.deserialize_model(proto))
    node = next(iter(view.iter_all_nodes()))

    def rule(alpha: float) -> Rule:
        root = OpMatch("QuickGelu", GRAPHOPT_DOMAIN, operands=(Var("x"),), attrs=(AttrMatch("alpha", literal=alpha),), name="q")
        return Rule("Q", root, (Replace("q", (Ref("x"),)),))

    assert isinstance(Matcher(view).attempt(rule(1.702), node), Match)
    failure = Matcher(view).attempt(rule(1.0), node)
    assert isinstance(failure, Failure) and "alpha = 1.702" in failure.reason


def test_lookups() -> None:
    conv = registry.spec("ai.onnx", "Conv")
    assert conv is not None and conv.default("group") == 1 and conv.default("auto_pad") == "NOTSET"
    assert [i.optional for i in conv.inputs] == [False, False, True]
    assert registry.has_fact("ai.onnx", "Add", "commutative") and not registry.has_fact("", "Sub", "commutative")
    assert not registry.has_fact(MS_DOMAIN, "Add", "commutative")  # facts are per domain
    assert registry.has_fact(MS_DOMAIN, "QuickGelu", "elementwise")
    assert "ReduceMean" in registry.names_with("keep_fp32")
    assert registry.fp32_outputs(MS_DOMAIN, "SkipLayerNormalization") == {1, 2}
    assert registry.spec("com.example", "Add") is None
    assert registry.with_defaults("SkipLayerNorm", {}) == {"epsilon": pytest.approx(1e-12)}
    with pytest.raises(KeyError, match="unknown fact"):
        registry.names_with("commutativ")
    with pytest.raises(ValueError, match="does not declare"):
        registry.register_torch_lowering("NoSuchOp", object())


def test_every_standard_op_with_facts_exists() -> None:
    """A misspelt name in standard_ops.py would silently carry no facts."""
    ort_ops = {(s.domain, s.name) for s in ort_state.get_all_operator_schema()}
    for op in registry.declared_ops():
        if op.domain == GRAPHOPT_DOMAIN:
            continue
        assert (not op.domain and onnx.defs.has(op.name)) or (op.domain, op.name) in ort_ops, op.qualified


def test_the_torch_lowerings_and_inductor_preference_come_from_the_registry() -> None:
    from graphopt.ops import torch_lowering

    assert torch_lowering.GRAPHOPT is registry.torch_lowerings()
    assert set(torch_lowering.GRAPHOPT) <= {op.name for op in registry.graphopt_ops()}
    assert torch_lowering.PREFERRED_OVER_INDUCTOR == registry.names_with("torch_beats_inductor", GRAPHOPT_DOMAIN) == {"FusedConv"}


# --------------------------------------------------------------------------- the old tables stay gone


def _op_name_sets(source: str, known: set[str]) -> list[int]:
    """Lines of module-level set / frozenset literals of two or more op names."""
    lines = []
    for node in ast.parse(source).body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "frozenset" and value.args:
            value = value.args[0]
        if isinstance(value, ast.Set):
            names = [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(names) >= 2 and all(n in known for n in names):
                lines.append(node.lineno)
    return lines


def test_no_module_outside_the_registry_keeps_its_own_table_of_op_names() -> None:
    known = {s.name for s in onnx.defs.get_all_schemas_with_history()} | {op.name for op in registry.declared_ops()}
    assert _op_name_sets('_COMMUTATIVE = frozenset({"Add", "Mul"})\nX: frozenset[str] = frozenset({"Relu", "Tanh"})\n', known) == [1, 2]
    offenders = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sorted((REPO / "graphopt").rglob("*.py"))
        if path.parent != REPO / "graphopt" / "ops"
        for line in _op_name_sets(path.read_text(), known)
    ]
    assert offenders == [], f"op facts belong in graphopt/ops/standard_ops.py or fused_ops.py: {offenders}"


def test_declarations_are_frozen_specs() -> None:
    for op in registry.declared_ops():
        assert isinstance(op, OpSpec)
        with pytest.raises(AttributeError):
            op.name = "x"  # type: ignore[misc]


# --------------------------------------------------------------------------- what people read


def test_the_report_says_which_targets_lower_the_op_a_target_lacks() -> None:
    from graphopt.report.hints import summarize_target_gaps

    [fused_conv, swiglu] = summarize_target_gaps([
        ("FuseConvActivation", "target onnx has no lowering for graphopt.FusedConv"),
        ("FuseSwiGLU", "target ort-cpu has no lowering for graphopt.SwiGLU"),
    ])
    assert fused_conv.endswith("--target ort-cpu or ort-cuda lower graphopt.FusedConv.")
    assert swiglu.endswith("no other --target lowers graphopt.SwiGLU (it runs on torch.compile only).")


def test_graphopt_ops_lists_the_declarations(cli) -> None:
    result = cli("ops")
    assert result.returncode == 0, result.stderr
    rows = {line.split("\t")[0]: line.split("\t") for line in result.stdout.splitlines()[1:]}
    assert set(rows) == {op.name for op in registry.graphopt_ops()}
    assert rows["QuickGelu"][2] == "alpha=1.702" and "onnx: Swish" in rows["QuickGelu"][3]
    assert rows["SkipLayerNorm"][4] == "graphopt::layer_norm"


#: torch-only graphopt ops -> (input shapes, attributes), lowered on fake CPU tensors.
_TORCH_CASES: dict[str, tuple[list[list[int]], dict[str, Any]]] = {
    "ScaledDotProductAttention": ([[2, 3, 5, 8], [2, 3, 7, 8], [2, 3, 7, 6]], {}),
    "SwiGLU": ([[2, 5, 16], [2, 5, 16]], {}),
    "GatedGelu": ([[2, 5, 16], [2, 5, 16]], {"approximate": "tanh"}),
    "GeGLU": ([[2, 5, 16], [16]], {}),
    "GemmActivation": ([[4, 8], [8, 6], [6]], {"activation": "Relu"}),
}


def test_the_torch_cases_cover_every_op_only_torch_runs() -> None:
    only_torch = {op.name for op in registry.graphopt_ops() if "ort-cpu" not in op.lowerings}
    assert only_torch - {"GroupNorm"} <= set(_TORCH_CASES)  # GroupNorm runs on ort-cuda only, not on torch


@pytest.mark.parametrize("name", sorted(_TORCH_CASES))
def test_declared_inference_matches_the_torch_lowerings_output_shapes(name: str) -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from graphopt.ops.torch_lowering import FxBuilder, ensure_kernels

    assert ensure_kernels() is None
    shapes, attrs = _TORCH_CASES[name]
    with FakeTensorMode() as mode:
        inputs = [torch.empty(*shape) for shape in shapes]
    (out,) = registry.torch_lowerings()[name].fn(FxBuilder(None, mode, evaluate=True), inputs, attrs, {0})
    op = registry.spec(GRAPHOPT_DOMAIN, name)
    assert op is not None and op.infer is not None
    inferred = op.infer(InferContext(op, lambda i: shapes[i], lambda n: attrs.get(n, MISSING), len(shapes)))
    assert [list(out.shape)] == inferred
