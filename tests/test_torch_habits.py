"""The torch path as a newcomer meets it (issue 19): a printable report, a log line per
compiled graph, and options checked before dynamo runs."""

from __future__ import annotations

import logging

import pytest
import torch

import graphopt
from graphopt.errors import GraphoptError, RuleNameError


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()


def test_report_prints_a_summary(fresh_torch_compile: None) -> None:
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():  # inference: the weights are frozen and Conv+BN folds
        torch.compile(_model(), backend="graphopt", options={"inductor": False})(x)
    report = graphopt.last_report()
    assert report is not None
    text = str(report)
    assert "Nodes by op type" in text and "Rewrites by rule" in text and "FoldConvBatchNorm" in text
    assert report.one_line().startswith(f"target {report.target}: ") and "FoldConvBatchNorm 1" in report.one_line()


def test_one_log_line_per_compiled_graph(fresh_torch_compile: None, caplog: pytest.LogCaptureFixture) -> None:
    x = torch.randn(1, 3, 8, 8)
    with caplog.at_level(logging.INFO, logger="graphopt"), torch.no_grad():
        torch.compile(_model(), backend="graphopt", options={"inductor": False})(x)
    lines = [r.getMessage() for r in caplog.records if r.name == "graphopt.torch"]
    assert len(lines) == len(graphopt.torch_reports()) == 1
    assert lines[0].startswith("graph 0: target ") and "rewrites (FoldConvBatchNorm 1" in lines[0]


def test_graphopt_logs_variable_prints_the_lines(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from graphopt import torch_backend

    root = logging.getLogger("graphopt")
    handlers, level = list(root.handlers), root.level
    try:
        monkeypatch.setenv("GRAPHOPT_LOGS", "info")
        torch_backend._log_settings()
        torch_backend._log_settings()  # once only
        torch_backend.LOG.info("graph 7: target torch: 3 -> 1 nodes")
        assert capsys.readouterr().err == "[graphopt] graph 7: target torch: 3 -> 1 nodes\n"
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_options_are_checked_before_dynamo_runs(fresh_torch_compile: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # graphopt.compile checks the options at once: dynamo never starts (torch.compile is not even called).
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("torch.compile was called"))
    with pytest.raises(RuleNameError, match="unknown rule 'NoSuchRule'"):
        graphopt.compile(_model(), options={"disable": ["NoSuchRule"]})
    with pytest.raises(GraphoptError, match="unknown graphopt option 'inductr'"):
        graphopt.compile(_model(), options={"inductr": False})
    with pytest.raises(GraphoptError, match="'kernels' takes"):
        graphopt.check_torch_options({"kernels": "some"})


def test_compile_runs_torch_compile_with_the_backend(fresh_torch_compile: None) -> None:
    x = torch.randn(1, 3, 8, 8)
    model = _model()
    compiled = graphopt.compile(model, options={"inductor": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert graphopt.last_report() is not None
