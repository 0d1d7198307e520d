"""Control flow end to end: models with If, Loop and Scan are optimized inside their
bodies (nested ones too), values captured from outer scopes stay correct, and the
optimized models compute what the originals do in onnxruntime, for every branch and
several trip counts.

What tests/test_onnx_graph.py and tests/test_passes_control_flow.py already cover (and
is not repeated here): Conv+BN folded inside If branches with outer weights, cast
chains inside a Loop and a Scan body, function bodies, constant-condition If inlining.
Here: nesting (If > Loop > If), a weight shared by a body and the main graph, a
rewrite root that is a body's output, a main-graph rewrite of a value a body
captures, a fusion inside a Scan body, the command line on a control-flow model, and
real exported models: TorchScript `for`/`while` loops (torch.jit.script,
torch.onnx.export(dynamo=False)) and torch.cond (torch.onnx.export(dynamo=True)).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_cli
from onnx import TensorProto, helper
from rule_testing import init, make_model, optimize_with, rewrites, run

import graphopt

F = TensorProto.FLOAT
BOOL = TensorProto.BOOL
I64 = TensorProto.INT64


def vi(name: str, elem: int, shape: list[int | str] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def scopes_of(report, rule: str) -> list[str]:
    return [r.scope for r in report.applied if r.rule == rule]


def subgraph(node: onnx.NodeProto, name: str) -> onnx.GraphProto:
    return next(a.g for a in node.attribute if a.name == name)


def assert_close(original: onnx.ModelProto, optimized: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    expected, actual = run(original, feeds), run(optimized, feeds)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ hand-built


def nested_model() -> onnx.ModelProto:
    """If(cond) { then: Loop(trips) { Conv+BN -> Tanh -> If(cond) { Cast chain | Neg } }
                  else: Conv+BN (the BN's output is the branch's output) }
    The Conv weights `w`, `b` are main-graph initializers, used by a main-graph Conv too."""
    inner_if = helper.make_node(
        "If",
        ["cond"],  # captured two scopes up
        ["acc_out"],
        name="inner_if",
        then_branch=helper.make_graph(
            [helper.make_node("Cast", ["t"], ["t64"], to=TensorProto.DOUBLE), helper.make_node("Cast", ["t64"], ["t32"], to=F)],
            "inner_then",
            [],
            [vi("t32", F, None)],
        ),
        else_branch=helper.make_graph([helper.make_node("Neg", ["t"], ["tn"])], "inner_else", [], [vi("tn", F, None)]),
    )
    loop_body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Conv", ["acc_in", "w", "b"], ["lc"], name="loop_conv", pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", ["lc", "g", "beta", "mean", "var"], ["lbn"], name="loop_bn"),
            helper.make_node("Tanh", ["lbn"], ["t"]),
            inner_if,
        ],
        "loop_body",
        [vi("i", I64, []), vi("cond_in", BOOL, []), vi("acc_in", F, None)],
        [vi("cond_out", BOOL, []), vi("acc_out", F, None)],
    )
    then_branch = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "x"], ["acc"], body=loop_body, name="loop")], "then", [], [vi("acc", F, None)]
    )
    else_branch = helper.make_graph(
        [
            # strides written out: CSE (which compares attributes as written) would otherwise
            # merge it with main_conv, and this test is about folding inside a branch
            helper.make_node("Conv", ["x", "w", "b"], ["ec"], name="else_conv", pads=[1, 1, 1, 1], strides=[1, 1]),
            helper.make_node("BatchNormalization", ["ec", "g", "beta", "mean", "var"], ["ebn"], name="else_bn"),
        ],
        "else",
        [],
        [vi("ebn", F, None)],
    )
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["z"], name="main_conv", pads=[1, 1, 1, 1]),
        helper.make_node("If", ["cond"], ["y"], name="outer_if", then_branch=then_branch, else_branch=else_branch),
    ]
    rng = np.random.default_rng(5)  # the same weights on every call
    inits = [
        init("w", (rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32)),
        *(init(name, rng.standard_normal(4).astype(np.float32)) for name in ("b", "g", "beta", "mean")),
        init("var", (rng.random(4) + 0.5).astype(np.float32)),
    ]
    return make_model(
        nodes,
        [vi("x", F, [1, 4, 5, 5]), vi("cond", BOOL, []), vi("trips", I64, [])],
        [vi("y", F, None), vi("z", F, [1, 4, 5, 5])],
        inits,
    )


def nested_feeds(cond: bool, trips: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(trips).standard_normal((1, 4, 5, 5)).astype(np.float32), "cond": np.array(cond), "trips": np.array(trips)}


def test_nested_bodies_are_rewritten_and_outer_values_stay_correct() -> None:
    model = nested_model()
    optimized, report = optimize_with(model, ["FoldConvBatchNorm", "CollapseCastChain", "DropNoOpCast"])
    folds = scopes_of(report, "FoldConvBatchNorm")
    assert sorted(folds) == ["main/outer_if.else_branch", "main/outer_if.then_branch/loop.body"]
    assert scopes_of(report, "CollapseCastChain") == ["main/outer_if.then_branch/loop.body/inner_if.then_branch"]
    assert rewrites(report, "DropNoOpCast") == 1

    main_conv, outer_if = optimized.graph.node
    # The main graph's Conv still reads the original, unfolded weights.
    assert main_conv.SerializeToString() == model.graph.node[0].SerializeToString()
    kept = {t.name: t for t in optimized.graph.initializer}
    assert {"w", "b"} <= set(kept) and kept["w"].SerializeToString() == model.graph.initializer[0].SerializeToString()
    loop = subgraph(outer_if, "then_branch").node[0]
    body_ops = [n.op_type for n in subgraph(loop, "body").node]
    assert "BatchNormalization" not in body_ops and "Conv" in body_ops
    inner_if = next(n for n in subgraph(loop, "body").node if n.op_type == "If")
    assert [n.op_type for n in subgraph(inner_if, "then_branch").node] == ["Identity"]
    else_graph = subgraph(outer_if, "else_branch")
    assert [n.op_type for n in else_graph.node if n.op_type != "Constant"] == ["Conv"]
    assert [o.name for o in else_graph.output] == ["ebn"]  # the rewritten root kept the branch's output name
    for cond in (True, False):
        for trips in (0, 1, 3):
            assert_close(model, optimized, nested_feeds(cond, trips))


def test_main_graph_rewrite_of_a_value_a_body_captures() -> None:
    """`c` = Cast(Cast(x)) is collapsed to x in the main graph; the Loop body reads `c`
    from the outer scope and must read x afterwards. The expected values are computed
    here: onnxruntime 1.31 cannot run the original (its always-on removal of
    widening-then-narrowing Cast pairs forgets the Loop's captured `c`: "Missing Input: c")."""
    i32 = TensorProto.INT32
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["acc_in", "c"], ["acc_out"])],
        "body",
        [vi("i", I64, []), vi("cond_in", BOOL, []), vi("acc_in", i32, [3])],
        [vi("cond_out", BOOL, []), vi("acc_out", i32, [3])],
    )
    model = make_model(
        [
            helper.make_node("Cast", ["x"], ["c64"], to=I64),
            helper.make_node("Cast", ["c64"], ["c"], to=i32),
            helper.make_node("Loop", ["trips", "", "x"], ["acc"], body=body, name="loop"),
        ],
        [vi("x", i32, [3]), vi("trips", I64, [])],
        [vi("acc", i32, None)],
    )
    optimized, report = optimize_with(model, ["CollapseCastChain", "DropNoOpCast"])
    assert rewrites(report, "CollapseCastChain") == 1 and rewrites(report, "DropNoOpCast") == 1
    assert [n.op_type for n in optimized.graph.node] == ["Loop"]
    captured = [i for n in subgraph(optimized.graph.node[0], "body").node for i in n.input]
    assert "x" in captured and "c" not in captured
    for trips in (0, 2, 5):
        expected = np.array([7, -2, 3], np.int32) * (trips + 1)
        np.testing.assert_array_equal(run(optimized, {"x": np.array([7, -2, 3], np.int32), "trips": np.array(trips)})[0], expected)


def test_fusion_inside_a_scan_body() -> None:
    """A written-out erf GELU per scanned row becomes the standard Gelu (opset 20)."""
    half, one, root2 = (init(n, np.array(v, np.float32)) for n, v in (("half", 0.5), ("one", 1.0), ("root2", math.sqrt(2.0))))
    body = helper.make_graph(
        [
            helper.make_node("Div", ["row", "root2"], ["scaled"]),
            helper.make_node("Erf", ["scaled"], ["erf"]),
            helper.make_node("Add", ["erf", "one"], ["erf1"]),
            helper.make_node("Mul", ["row", "erf1"], ["prod"]),
            helper.make_node("Mul", ["prod", "half"], ["gelu"]),
            helper.make_node("Add", ["sum_in", "gelu"], ["sum_out"]),
        ],
        "scan_body",
        [vi("sum_in", F, [4]), vi("row", F, [4])],
        [vi("sum_out", F, [4]), vi("gelu", F, [4])],
    )
    model = make_model(
        [helper.make_node("Scan", ["zero", "rows"], ["total", "each"], body=body, num_scan_inputs=1, name="scan")],
        [vi("rows", F, [5, 4])],
        [vi("total", F, [4]), vi("each", F, [5, 4])],
        [init("zero", np.zeros(4, np.float32)), half, one, root2],  # half/one/root2 are captured by the body
        opset=20,
    )
    optimized, report = optimize_with(model, ["FuseGeluErf"])
    assert scopes_of(report, "FuseGeluErf") == ["main/scan.body"]
    body_ops = [n.op_type for n in subgraph(optimized.graph.node[0], "body").node]
    assert body_ops == ["Gelu", "Add"]
    assert_close(model, optimized, {"rows": np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)})


def test_command_line_on_a_control_flow_model(tmp_path: Path) -> None:
    model = nested_model()
    source = tmp_path / "nested.onnx"
    onnx.save(model, source)
    out = tmp_path / "nested.opt.onnx"
    result = run_cli("optimize", source, "-o", out, "--report", tmp_path / "r.json", "--verify", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    import json

    applied = json.loads((tmp_path / "r.json").read_text())
    text = json.dumps(applied)
    assert "loop.body" in text and "inner_if.then_branch" in text
    optimized = onnx.load(out)
    for cond in (True, False):
        for trips in (0, 2):
            assert_close(model, optimized, nested_feeds(cond, trips))


# ------------------------------------------------------------------ exported with torch


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Three real exports with control flow; weights seeded. Exported once per module."""
    torch = pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("exported")
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        """Written-out LayerNorm, Linear, written-out erf GELU, residual."""

        def __init__(self, d: int = 16) -> None:
            super().__init__()
            self.g = torch.nn.Parameter(torch.rand(d) + 0.5)
            self.b = torch.nn.Parameter(torch.randn(d) * 0.1)
            self.fc = torch.nn.Linear(d, d)

        def forward(self, x):
            mean = x.mean(-1, keepdim=True)
            d = x - mean
            var = (d * d).mean(-1, keepdim=True)
            h = self.fc(d / torch.sqrt(var + 1e-5) * self.g + self.b)
            return x + h * 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0)))

    class ForLoop(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()

        def forward(self, x, n: int):
            for _ in range(n):  # trip count from an input: an ONNX Loop
                x = self.block(x)
            return x

    class WhileLoop(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()

        def forward(self, x):
            i = 0
            while bool(x.abs().max() < 10.0) and i < 6:  # stops on the data: a Loop with a computed condition
                x = self.block(x) * 1.5
                i += 1
            return x

    class Cond(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = Block(), Block()

        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda x: self.a(x), lambda x: self.b(x) * 2, (x,))

    x = torch.randn(2, 3, 16)
    paths = {name: folder / f"{name}.onnx" for name in ("for", "while", "cond")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            torch.jit.script(ForLoop().eval()), (x, 3), paths["for"], dynamo=False, input_names=["x", "n"], output_names=["y"], opset_version=20
        )
        torch.onnx.export(torch.jit.script(WhileLoop().eval()), (x,), paths["while"], dynamo=False, input_names=["x"], output_names=["y"], opset_version=17)
        program = torch.onnx.export(Cond().eval(), (x,), dynamo=True, verbose=False)
        program.save(str(paths["cond"]))
    ops = {name: [n.op_type for n in onnx.load(p).graph.node] for name, p in paths.items()}
    assert "Loop" in ops["for"] and "Loop" in ops["while"] and "If" in ops["cond"], ops
    yield paths


def x_like(seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((2, 3, 16)) * scale).astype(np.float32)


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
def test_exported_torchscript_for_loop(exported: dict[str, Path], target: str) -> None:
    model = onnx.load(exported["for"])
    optimized, report = graphopt.optimize(onnx.load(exported["for"]), target=target)
    loop = next(n for n in optimized.graph.node if n.op_type == "Loop")
    body_ops = [n.op_type for n in subgraph(loop, "body").node]
    # Opset 20: the written-out erf GELU becomes the standard Gelu inside the Loop body,
    # and on onnxruntime its bias Add joins it (com.microsoft.BiasGelu).
    assert scopes_of(report, "FuseGeluErf") == ["main//Loop.body"]
    assert "Erf" not in body_ops
    if target == "ort-cpu":
        assert scopes_of(report, "FuseBiasGelu") == ["main//Loop.body"] and "BiasGelu" in body_ops
    else:
        assert "Gelu" in body_ops
    for n in (0, 1, 3):
        assert_close(model, optimized, {"x": x_like(n), "n": np.array(n)})


def test_exported_torchscript_while_loop(exported: dict[str, Path]) -> None:
    model = onnx.load(exported["while"])
    optimized, report = graphopt.optimize(onnx.load(exported["while"]), target="ort-cpu")
    body_rules = {r.rule for r in report.applied if "Loop.body" in r.scope}
    assert {"FuseGeluErf", "FuseBiasGelu", "DropNoOpCast"} <= body_rules
    for seed, scale in ((0, 1.0), (1, 0.01), (2, 20.0)):  # several, one and zero iterations
        assert_close(model, optimized, {"x": x_like(seed, scale)})


def test_exported_torch_cond_through_the_command_line(exported: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "cond.opt.onnx"
    result = run_cli("optimize", exported["cond"], "-o", out, "--report", tmp_path / "r.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    optimized = onnx.load(out)
    branch_ops = {a.name: [n.op_type for n in a.g.node] for n in optimized.graph.node if n.op_type == "If" for a in n.attribute}
    for name in ("then_branch", "else_branch"):
        assert "LayerNormalization" in branch_ops[name] and "Gelu" in branch_ops[name], branch_ops
        assert "Erf" not in branch_ops[name] and "ReduceMean" not in branch_ops[name]
    model = onnx.load(exported["cond"])
    for seed in range(4):  # both signs of x.sum(): both branches
        x = x_like(seed)
        x = x if (seed % 2 == 0) == (x.sum() > 0) else -x
        assert_close(model, optimized, {"x": x})
