"""log1p on FX: split into Log(Add(x, 1)) so FuseSoftplus sees what ONNX graphs show, merged
back after the rules wherever no rule used it, and a log(x + 1) the user wrote left as written."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from graphopt.api import builtin_rules
from graphopt.match.driver import RuleSet
from graphopt.ops import torch_lowering
from graphopt.report.model import Report
from graphopt.torch_backend import TorchOptions, optimize_fx, trace_to_aten

aten = torch.ops.aten


class Logs(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.log1p(x.abs()), torch.log(x.abs() + 1), torch.log1p(torch.exp(x))


def _optimized(module: torch.nn.Module, x: torch.Tensor) -> tuple[torch.fx.GraphModule, Report]:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    gm = trace_to_aten(module, [mode.from_tensor(x)], mode)
    report = Report(target="torch")
    optimize_fx(gm, mode, RuleSet(builtin_rules()), torch_lowering.torch_target(training=False, kernels="all"), report,
                TorchOptions(inductor=False))
    return gm, report


def test_unused_log1p_is_merged_back_and_softplus_is_fused() -> None:
    x = torch.linspace(-1e-3, 1e-3, 64)  # near 0, where log1p is more precise than log(x + 1)
    gm, report = _optimized(Logs(), x)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(aten.log1p.default) == 1  # the first output, as written
    assert targets.count(aten.log.default) == 1  # the user's log(x + 1), as written
    assert targets.count(aten.softplus.default) == 1 and report.rules["FuseSoftplus"].applications == 1
    got, expected = gm(x), Logs()(x)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)  # log1p's own result, bit for bit
    torch.testing.assert_close(got[1], expected[1], rtol=0, atol=0)
    torch.testing.assert_close(got[2], expected[2])
