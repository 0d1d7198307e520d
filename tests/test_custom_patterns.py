"""User rules from a folder (`--patterns DIR`): a .pdll rule and a Python-form rule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
from rule_testing import TensorProto, assert_same_outputs, helper, make_model

import graphopt
from graphopt.pattern.printer import print_rule

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "custom_patterns"


def chain_model() -> onnx.ModelProto:
    return make_model(
        [
            helper.make_node("Neg", ["x"], ["n1"]),
            helper.make_node("Neg", ["n1"], ["n2"]),
            helper.make_node("Relu", ["n2"], ["r1"]),
            helper.make_node("Relu", ["r1"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )


def test_user_rules_load_and_apply_from_python() -> None:
    model = chain_model()
    optimized, report = graphopt.optimize(model, patterns=[EXAMPLES])
    assert report.rules["DoubleNegation"].applications == 1
    assert report.rules["ReluOfRelu"].applications == 1
    assert [n.op_type for n in optimized.graph.node] == ["Relu"]
    assert_same_outputs(model, optimized)


def test_python_form_rule_prints_as_pdll() -> None:
    rules = {r.name: r for r in graphopt.load_patterns(EXAMPLES)}
    text = print_rule(rules["ReluOfRelu"])
    assert "op<Relu>" in text and "replace" in text
    assert rules["ReluOfRelu"].doc.startswith("Relu(Relu(x))")


def test_user_rules_from_the_command_line(tmp_path: Path) -> None:
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(chain_model(), src)
    done = subprocess.run(
        [sys.executable, "-m", "graphopt", "optimize", str(src), "-o", str(out), "--patterns", str(EXAMPLES), "--enable", "DoubleNegation", "--quiet"],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Relu", "Relu"]
