"""One rule, both graph kinds: apply the same rule to the ONNX export of a small torch
module and to the FX graph of the same module (as the torch backend traces it), and
check that it rewrites the same number of times on both and that both results compute
what the module computes.

`CASES` (tests/both_kinds_cases.py) is the table: (rule, module builder, inputs,
expected rewrites). `coverage()` says for every rule of the loaded library whether it
is proven on both kinds, on one, or why it cannot be (the ``// ONNX only:`` /
``// FX only:`` line above the rule in its .pdll file).

    python tests/both_kinds.py            # the per-rule table and the totals
    python tests/both_kinds.py -k Gelu    # only rules whose name contains Gelu
"""

from __future__ import annotations

import io
import math
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import torch

import graphopt
from graphopt.api import builtin_rules
from graphopt.match.driver import RuleSet
from graphopt.ops import torch_lowering
from graphopt.passes.nhwc_emulation import emulate_nhwc_ops
from graphopt.pattern.ir import Rule
from graphopt.report.model import Report
from graphopt.torch_backend import TorchOptions, optimize_fx, trace_to_aten

__all__ = ["Case", "Outcome", "run_case", "coverage", "one_kind_reasons"]


@dataclass(frozen=True)
class Case:
    """One rule applied to one torch module on both graph kinds."""

    rule: str
    module: Callable[[], torch.nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    #: Rewrites of `rule` expected on each kind.
    count: int
    #: Rules that run along (those that make the op this rule's root matches, say).
    along: tuple[str, ...] = ()
    #: The ONNX side's target (graphopt ops with an onnxruntime lowering only: ort-cpu; ort-cuda's
    #: NHWC-only ops, com.microsoft.GroupNorm, run on the CPU written back as standard ops).
    onnx_target: str = "onnx"
    #: Opset of the ONNX export (the torchscript exporter: above 20, exported at 20 and converted with
    #: onnx.version_converter; the dynamo exporter exports at the opset itself).
    opset: int = 18
    #: "torchscript" (fast; its exporter folds Conv+BatchNorm and composes Transposes itself), or
    #: "dynamo" (torch.onnx.export(dynamo=True) without onnxscript's optimizer).
    exporter: str = "torchscript"
    rtol: float = 1e-4
    atol: float = 1e-5
    #: A name for the case when a rule has several.
    name: str = ""
    #: The kinds to run it on: ("fx",) for a rule that says why it serves FX only, to prove that much.
    kinds: tuple[str, ...] = ("onnx", "fx")

    @property
    def id(self) -> str:
        return f"{self.rule}-{self.name}" if self.name else self.rule


@dataclass
class Outcome:
    onnx_rewrites: int
    fx_rewrites: int
    onnx_problem: str | None = None  # outputs differ, or the export failed
    fx_problem: str | None = None
    onnx_misses: list[str] = field(default_factory=list)
    fx_misses: list[str] = field(default_factory=list)

    def proven(self, case: Case) -> bool:
        """The expected rewrites, and the module's outputs, on every kind the case runs on."""
        onnx_ok = "onnx" not in case.kinds or (self.onnx_rewrites == case.count and not self.onnx_problem)
        fx_ok = "fx" not in case.kinds or (self.fx_rewrites == case.count and not self.fx_problem)
        return onnx_ok and fx_ok


def _rules(names: Sequence[str]) -> RuleSet:
    wanted = set(names)
    return RuleSet([r for r in builtin_rules() if r.name in wanted])


def _misses(report: Report, rule: str) -> list[str]:
    stats = report.rules.get(rule)
    return [f"{m.node}: {m.reason}" for m in stats.near_misses] if stats is not None else []


def _applied(report: Report, rule: str) -> int:
    stats = report.rules.get(rule)
    return stats.applications if stats is not None else 0


def _close(actual: Sequence[Any], expected: Sequence[torch.Tensor], case: Case) -> str | None:
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        a = np.asarray(a.detach().cpu() if isinstance(a, torch.Tensor) else a)
        e = e.detach().cpu().numpy()
        if a.shape != e.shape:
            return f"output {i}: shape {a.shape}, expected {e.shape}"
        if not np.allclose(a, e, rtol=case.rtol, atol=case.atol, equal_nan=True):
            return f"output {i}: max abs difference {float(np.max(np.abs(a.astype(np.float64) - e))):.3g}"
    return None


def _flat(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def export_onnx(case: Case, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> onnx.ModelProto:
    """The module exported by `case.exporter`, at `case.opset`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if case.exporter == "dynamo":
            return torch.onnx.export(module, inputs, dynamo=True, optimize=False, opset_version=case.opset, verbose=False).model_proto
        else:
            buffer = io.BytesIO()
            torch.onnx.export(module, inputs, buffer, dynamo=False, opset_version=min(case.opset, 20))
            model = onnx.load_from_string(buffer.getvalue())
    if case.opset > 20:
        model = onnx.version_converter.convert_version(model, case.opset)
    return model


def write_back_bias_split_gelu(model: onnx.ModelProto) -> onnx.ModelProto:
    """com.microsoft.BiasSplitGelu(x, bias) (CUDA only) as the standard ops it computes
    (bias_split_gelu_impl.cu): s = x + bias; s[..., :h] * erf-GELU(s[..., h:])."""
    graph = model.graph
    nodes: list[onnx.NodeProto] = []
    for i, node in enumerate(graph.node):
        if (node.domain, node.op_type) != ("com.microsoft", "BiasSplitGelu"):
            nodes.append(node)
            continue
        bias = next(onnx.numpy_helper.to_array(init) for init in graph.initializer if init.name == node.input[1])
        half, p = bias.shape[-1] // 2, f"bsg{i}_"
        consts = {"lo": [0], "mid": [half], "hi": [2 * half], "axis": [-1]}
        graph.initializer.extend(onnx.numpy_helper.from_array(np.array(v, np.int64), p + k) for k, v in consts.items())
        graph.initializer.extend(onnx.numpy_helper.from_array(np.array(v, bias.dtype), p + k) for k, v in
                                 {"sqrt2": math.sqrt(2.0), "half": 0.5, "one": 1.0}.items())
        make = onnx.helper.make_node
        nodes += [
            make("Add", [node.input[0], node.input[1]], [p + "s"]),
            make("Slice", [p + "s", p + "lo", p + "mid", p + "axis"], [p + "a"]),
            make("Slice", [p + "s", p + "mid", p + "hi", p + "axis"], [p + "g"]),
            make("Div", [p + "g", p + "sqrt2"], [p + "gs"]), make("Erf", [p + "gs"], [p + "e"]),
            make("Add", [p + "e", p + "one"], [p + "e1"]), make("Mul", [p + "g", p + "half"], [p + "gh"]),
            make("Mul", [p + "gh", p + "e1"], [p + "gelu"]), make("Mul", [p + "a", p + "gelu"], list(node.output)),
        ]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def run_onnx(case: Case, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], expected: list[torch.Tensor]) -> tuple[int, str | None, list[str]]:
    model = export_onnx(case, module, inputs)
    optimized, report = graphopt.optimize(model, target=case.onnx_target, enable=[case.rule, *case.along])
    if case.onnx_target == "ort-cuda":  # no CUDA here: its CUDA-only ops written back as standard ops for the CPU
        written_back = ir.serde.deserialize_model(optimized)
        emulate_nhwc_ops(written_back)
        optimized = write_back_bias_split_gelu(ir.serde.serialize_model(written_back))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # graphopt's rewrite, not onnxruntime's
    session = ort.InferenceSession(optimized.SerializeToString(), options, providers=["CPUExecutionProvider"])
    got = session.run(None, {arg.name: x.numpy() for arg, x in zip(session.get_inputs(), inputs)})
    return _applied(report, case.rule), _close(got, expected, case), _misses(report, case.rule)


def run_fx(case: Case, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], expected: list[torch.Tensor]) -> tuple[int, str | None, list[str]]:
    """The module traced to ATen as the torch backend traces dynamo's graphs (parameters
    become constants, as the backend freezes them), the rules run through optimize_fx."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    gm = trace_to_aten(module, [mode.from_tensor(x) for x in inputs], mode)
    report = Report(target="torch")
    target = torch_lowering.torch_target(training=False, kernels="all")
    optimize_fx(gm, mode, _rules([case.rule, *case.along]), target, report, TorchOptions(inductor=False))
    with torch.no_grad():
        got = _flat(gm(*inputs))
    return _applied(report, case.rule), _close(got, expected, case), _misses(report, case.rule)


def run_case(case: Case) -> Outcome:
    torch.manual_seed(0)
    module = case.module().eval()
    inputs = case.inputs()
    with torch.no_grad():
        expected = _flat(module(*inputs))
    results: dict[str, tuple[int, str | None, list[str]]] = {}
    for kind, run in (("onnx", run_onnx), ("fx", run_fx)):
        if kind not in case.kinds:
            results[kind] = (0, None, [])
            continue
        try:
            results[kind] = run(case, module, inputs, expected)
        except Exception as error:  # noqa: BLE001 - reported in the outcome, the table goes on
            first = (str(error).strip().splitlines() or [""])[0]
            results[kind] = (0, f"{type(error).__name__}: {first}", [])
    (onnx_count, onnx_problem, onnx_misses), (fx_count, fx_problem, fx_misses) = results["onnx"], results["fx"]
    return Outcome(onnx_count, fx_count, onnx_problem, fx_problem, onnx_misses, fx_misses)


# --------------------------------------------------------------------------- why a rule serves one kind

_ONE_KIND = re.compile(r"^\s*//\s*(ONNX|FX) only:\s*(\S.*)$")


def one_kind_reasons(rules: Sequence[Rule] | None = None) -> dict[str, tuple[str, str]]:
    """rule -> (the kind it serves, why not the other), from the ``// ONNX only: why`` or
    ``// FX only: why`` line among the comment lines right above the rule in its file."""
    found: dict[str, tuple[str, str]] = {}
    for rule in rules if rules is not None else builtin_rules():
        loc = str(rule.loc or "")
        match = re.match(r"(.*):(\d+):\d+$", loc)
        if match is None or not Path(match.group(1)).is_file():
            continue
        lines = Path(match.group(1)).read_text(encoding="utf-8").splitlines()
        i = int(match.group(2)) - 2  # the line above `Pattern`
        while i >= 0 and lines[i].lstrip().startswith("//"):
            hit = _ONE_KIND.match(lines[i])
            if hit is not None:
                found[rule.name] = (hit.group(1), hit.group(2).strip())
                break
            i -= 1
    return found


def coverage(cases: Sequence[Case], names: Sequence[str] | None = None, outcomes: dict[str, Outcome] | None = None) -> dict[str, str]:
    """rule -> "both", "ONNX only: why", "FX only: why", or what went wrong, for every built-in rule."""
    rules = builtin_rules()
    reasons = one_kind_reasons(rules)
    by_rule: dict[str, list[Case]] = {}
    for case in cases:
        by_rule.setdefault(case.rule, []).append(case)
    result: dict[str, str] = {}
    for rule in rules:
        if names is not None and rule.name not in names:
            continue
        verdicts = []
        for case in by_rule.get(rule.name, []):
            outcome = (outcomes or {}).get(case.id) or run_case(case)
            if outcome.proven(case):
                verdicts.append("both" if len(case.kinds) == 2 else f"proven on {case.kinds[0].upper()}")
            else:
                problem = outcome.onnx_problem or outcome.fx_problem or ""
                verdicts.append(f"FAILED {case.id}: onnx {outcome.onnx_rewrites}, fx {outcome.fx_rewrites}, expected {case.count} {problem}")
        failed = next((v for v in verdicts if v.startswith("FAILED")), None)
        if failed is not None:
            result[rule.name] = failed
        elif "both" in verdicts:
            result[rule.name] = "both"
        elif rule.name in reasons:
            kind, why = reasons[rule.name]
            result[rule.name] = f"{kind} only: {why}" + (f" ({verdicts[0]})" if verdicts else "")
        else:
            result[rule.name] = "neither proven on both kinds nor explained"
    return result


def main(argv: list[str]) -> int:
    from both_kinds_cases import CASES

    pattern = argv[argv.index("-k") + 1] if "-k" in argv else ""
    names = [r.name for r in builtin_rules() if pattern in r.name]
    table = coverage(CASES, names)
    width = max(map(len, table), default=0)
    for rule, verdict in table.items():
        print(f"{rule:<{width}}  {verdict}")
    both = sum(v == "both" for v in table.values())
    onnx_only = sum(v.startswith("ONNX only") for v in table.values())
    fx_only = sum(v.startswith("FX only") for v in table.values())
    print(f"\n{len(table)} rules: {both} proven on both kinds ({100 * both / max(len(table), 1):.0f} %), "
          f"{onnx_only} ONNX only, {fx_only} FX only, {len(table) - both - onnx_only - fx_only} neither proven nor explained")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main(sys.argv[1:]))
