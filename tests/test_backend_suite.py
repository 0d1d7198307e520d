"""The ONNX backend test suite shipped in the onnx package, run through onnxruntime
with and without graphopt: no test that passes without graphopt fails with it.
(The whole suite: ~2000 tests, seconds per target; counts in benchmarks/RESULTS.md.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


def _suite():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "backend_suite.py"
    spec = importlib.util.spec_from_file_location("graphopt_backend_suite", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


suite = _suite()


@pytest.fixture(scope="module")
def tests():
    found = suite.discover()
    assert len(found) > 1500  # node, simple, pytorch-converted, pytorch-operator and real tests
    return found


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
def test_graphopt_breaks_no_backend_test(tests, target: str) -> None:
    result = suite.run_suite(tests, target=target, jobs=2)
    assert result.passed_base > 1000
    assert [test_id for test_id, _ in result.regressions] == []
    assert result.passed_opt >= result.passed_base
