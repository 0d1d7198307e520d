"""Shared fixtures: small models built with onnx.helper, pattern folders, and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent

F = TensorProto.FLOAT
_RNG = np.random.default_rng(7)


def _rand(*shape: int, positive: bool = False) -> np.ndarray:
    a = _RNG.standard_normal(shape)
    return (np.abs(a) + 0.5 if positive else a).astype(np.float32)


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def conv_bn_model(with_miss: bool = True) -> onnx.ModelProto:
    """x -> Conv -> BN -> Relu -> Conv -> BN -> y: two foldable Conv+BN pairs.

    With `with_miss`, a third Conv takes its weights from a graph input, so the fold
    rule gets part of the way there and fails on `w: Const` (a near-miss)."""
    c = 4
    nodes, inits = [], []

    def conv_bn(inp: str, i: int, weight: str | None = None) -> str:
        w = weight or f"w{i}"
        if weight is None:
            inits.append(_init(w, _rand(c, c if i > 1 else 3, 3, 3)))
        inits.extend(
            [
                _init(f"b{i}", _rand(c)),
                _init(f"g{i}", _rand(c)),
                _init(f"beta{i}", _rand(c)),
                _init(f"mean{i}", _rand(c)),
                _init(f"var{i}", _rand(c, positive=True)),
            ]
        )
        nodes.append(helper.make_node("Conv", [inp, w, f"b{i}"], [f"conv{i}_out"], name=f"conv{i}", pads=[1, 1, 1, 1]))
        nodes.append(
            helper.make_node(
                "BatchNormalization",
                [f"conv{i}_out", f"g{i}", f"beta{i}", f"mean{i}", f"var{i}"],
                [f"bn{i}_out"],
                name=f"bn{i}",
                epsilon=1e-5,
            )
        )
        return f"bn{i}_out"

    h = conv_bn("x", 1)
    nodes.append(helper.make_node("Relu", [h], ["relu1_out"], name="relu1"))
    y = conv_bn("relu1_out", 2)
    nodes.append(helper.make_node("Identity", [y], ["y"], name="out"))
    inputs = [helper.make_tensor_value_info("x", F, ["N", 3, 8, 8])]
    outputs = [helper.make_tensor_value_info("y", F, ["N", c, 8, 8])]
    if with_miss:
        z = conv_bn("relu1_out", 3, weight="w_in")
        nodes.append(helper.make_node("Identity", [z], ["z"], name="out_z"))
        inputs.append(helper.make_tensor_value_info("w_in", F, [c, c, 3, 3]))
        outputs.append(helper.make_tensor_value_info("z", F, ["N", c, 8, 8]))
    return make_model(nodes, inputs, outputs, inits)


def relu_chain_model() -> onnx.ModelProto:
    """x -> Add -> Relu -> Mul -> Relu -> y: Relu matters (inputs are normal, half negative)."""
    nodes = [
        helper.make_node("Add", ["x", "c0"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r1"], name="relu1"),
        helper.make_node("Mul", ["r1", "c1"], ["m"], name="mul"),
        helper.make_node("Sub", ["m", "c0"], ["s"], name="sub"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node("Identity", ["r2"], ["y"], name="out"),
    ]
    inits = [_init("c0", _rand(1, 64)), _init("c1", _rand(1, 64))]
    return make_model(
        nodes, [helper.make_tensor_value_info("x", F, ["batch", 64])], [helper.make_tensor_value_info("y", F, ["batch", 64])], inits
    )


def int_bool_model(vocab: int = 5) -> onnx.ModelProto:
    """Token ids index a table of `vocab` rows; a bool mask zeroes some positions."""
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
        helper.make_node("Cast", ["mask"], ["mf"], to=F, name="cast"),
        helper.make_node("Unsqueeze", ["mf", "axes"], ["mu"], name="unsq"),
        helper.make_node("Mul", ["e", "mu"], ["y"], name="mul"),
        helper.make_node("ReduceSum", ["ids"], ["total"], keepdims=0, name="sum"),
    ]
    inits = [_init("emb", _rand(vocab, 4)), _init("axes", np.array([-1], np.int64))]
    inputs = [
        helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", "seq"]),
    ]
    outputs = [helper.make_tensor_value_info("y", F, ["batch", "seq", 4]), helper.make_tensor_value_info("total", TensorProto.INT64, [])]
    return make_model(nodes, inputs, outputs, inits)


def symbolic_model() -> onnx.ModelProto:
    """Two inputs sharing symbolic dims: same name, same size."""
    nodes = [helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    inputs = [helper.make_tensor_value_info("a", F, ["batch", "seq", 4]), helper.make_tensor_value_info("b", F, ["batch", "seq", 4])]
    return make_model(nodes, inputs, [helper.make_tensor_value_info("y", F, ["batch", "seq", 4])])


#: A rule that is wrong on purpose: Relu(x) -> x. Verification must catch and drop it.
WRONG_PDLL = """\
// Rules that are wrong on purpose, for testing --verify.

/// Relu(x) -> x (wrong: negative values pass)
Pattern DropRelu {
  let r = op<Relu>(x);
  replace r with x;
}
"""

#: A wrong rule whose damage comes from a native helper registered in Python.
WRONG_NATIVE_PDLL = """\
// A rewrite whose native helper computes the wrong thing, for testing --verify.

Rewrite HalfOf(x) -> (k);

/// Relu(x) -> x * 0.5 (wrong: the helper's constant is not Relu)
Pattern HalveInsteadOfRelu {
  let r = op<Relu>(x);
  rewrite r with {
    let h = HalfOf(x);
    replace r with op<Mul>(x, h.k);
  };
}
"""

WRONG_NATIVE_PY = '''\
"""Native helper for wrong_native.pdll."""

import numpy as np

from graphopt.pattern.native import native_rewrite


@native_rewrite("HalfOf")
def half_of(ctx, x):
    return {"k": np.array(0.5, dtype=np.float32)}
'''


@pytest.fixture
def write_model(tmp_path: Path) -> Callable[..., Path]:
    def write(model: onnx.ModelProto, name: str = "model.onnx") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))
        return path

    return write


@pytest.fixture
def conv_bn_path(write_model: Callable[..., Path]) -> Path:
    return write_model(conv_bn_model(), "conv_bn.onnx")


@pytest.fixture
def wrong_patterns(tmp_path: Path) -> Path:
    folder = tmp_path / "wrong_patterns"
    folder.mkdir()
    (folder / "wrong.pdll").write_text(WRONG_PDLL)
    return folder


@pytest.fixture
def wrong_native_patterns(tmp_path: Path) -> Path:
    folder = tmp_path / "wrong_native_patterns"
    folder.mkdir()
    (folder / "wrong_native.pdll").write_text(WRONG_NATIVE_PDLL)
    (folder / "wrong_native.py").write_text(WRONG_NATIVE_PY)
    return folder


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str | os.PathLike[str], cwd: Path | None = None, timeout: float = 300) -> CliResult:
    """Run `python -m graphopt ARGS` in a subprocess, with this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("FORCE_COLOR", None)
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "200"  # rich wraps tables to the terminal width; keep rows on one line
    done = subprocess.run(
        [sys.executable, "-m", "graphopt", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    return CliResult(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def cli(tmp_path: Path) -> Callable[..., CliResult]:
    def call(*args: str | os.PathLike[str]) -> CliResult:
        return run_cli(*args, cwd=tmp_path)

    return call


# --------------------------------------------------------------------------- torch.compile tests


@pytest.fixture
def fresh_torch_compile() -> Iterator[None]:
    """dynamo's caches and graphopt's torch reports cleared before and after the test."""
    import torch

    from graphopt.torch_backend import clear_reports

    torch._dynamo.reset()
    clear_reports()
    yield
    torch._dynamo.reset()
    clear_reports()


@pytest.fixture
def graphopt_never_falls_back(fresh_torch_compile: None) -> Iterator[None]:
    """Fails the test if graphopt fell back to the traced graph on any graph it compiled
    (by default it does so with only a warning)."""
    from graphopt.torch_backend import torch_reports

    yield
    fell_back = [w for r in torch_reports() for w in r.warnings if "graphopt failed" in w]
    assert not fell_back, fell_back


@pytest.fixture
def wq_linear_timed_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weight-only quantization's form decision made as on CUDA, with graphopt's wq_linear timed
    fastest: tests of the kernel (its CPU reference here), its budget, report and autotuning. The
    CPU's own forms and timing are tests/test_torch_weight_quant_cpu.py's."""
    from graphopt.passes import fx_weight_quant, fx_weight_quant_forms

    monkeypatch.setattr(fx_weight_quant, "MEASURE_OFF_CUDA", True)
    monkeypatch.setattr(fx_weight_quant_forms, "TIMER", lambda name, fn: (fn(), 1.0 if name == "wq_linear" else 2.0)[1])
    monkeypatch.setattr(fx_weight_quant_forms, "_TIMES", {})
