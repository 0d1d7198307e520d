"""benchmarks/qdq_bench.py on CUDA: the offline anchor's quantized kernels are read on the bench's device.

The 2026-11-27 H100 run stopped on bert-dyn and bert-int4-qdq with "Could not find an implementation
for BiasSoftmax(1)": onnxruntime's BiasSoftmaxFusion (a level-2 fusion for nodes on the CUDA
provider) had put a com.microsoft.BiasSoftmax into the model its CUDA session saved, and the bench
then opened that model in a CPU-only session to count its quantized kernels. The CUDA provider
registers BiasSoftmax (float, float16, double; attributes axis and is_inner_broadcast, no rank
limit); the CPU provider has no kernel for it. graphopt never writes BiasSoftmax.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

ort = pytest.importorskip("onnxruntime")
ROOT = Path(__file__).resolve().parents[1]


def _bench() -> Any:
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("graphopt_qdq_bench", ROOT / "benchmarks" / "qdq_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bias_softmax_model(path: Path) -> None:
    node = helper.make_node("BiasSoftmax", ["x", "bias"], ["y"], domain="com.microsoft", axis=-1, is_inner_broadcast=0,
                            name="BiasSoftmax")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8]),
                                            helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 1, 1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]), str(path))


def test_bias_softmax_has_a_cuda_kernel_and_no_cpu_kernel(tmp_path: Path) -> None:
    """The cause, as the snapshotted kernel tables and a CPU session say it."""
    tables = ROOT / "graphopt" / "ops" / "data"
    cuda = json.loads((tables / "ort_cuda_kernels.json").read_text())["kernels"]
    cpu = json.loads((tables / "ort_cpu_kernels.json").read_text())["kernels"]
    assert {"f16", "f32"} <= set(cuda["com.microsoft::BiasSoftmax"])
    assert "com.microsoft::BiasSoftmax" not in cpu
    _bias_softmax_model(tmp_path / "m.onnx")
    with pytest.raises(Exception, match="BiasSoftmax"):
        ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])


class _RecordingOrt:
    """onnxruntime with InferenceSession recording its providers and saving the model as it came."""

    def __init__(self) -> None:
        self.providers: list[Any] = []
        self.SessionOptions = ort.SessionOptions
        self.GraphOptimizationLevel = ort.GraphOptimizationLevel

    def InferenceSession(self, path: str, options: Any, providers: list[Any]) -> None:  # noqa: N802 - onnxruntime's name
        self.providers = list(providers)
        shutil.copyfile(path, options.optimized_model_filepath)


def test_quantized_kernels_are_read_on_the_bench_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    fake = _RecordingOrt()
    monkeypatch.setattr(bench, "_ort", lambda: fake)
    _bias_softmax_model(tmp_path / "m.onnx")
    assert bench.quantized_kernels(tmp_path / "m.onnx", tmp_path / "dump.onnx", "cuda") == {}
    assert any("CUDAExecutionProvider" in str(p) for p in fake.providers)
    bench.quantized_kernels(tmp_path / "m.onnx", tmp_path / "dump.onnx", "cpu")
    assert fake.providers == ["CPUExecutionProvider"]


def test_quantized_kernels_on_the_cpu_count_fused_kernels(tmp_path: Path) -> None:
    """The real thing on the CPU: a QDQ MatMul unit becomes QLinearMatMul."""
    bench = _bench()
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor("s", TensorProto.FLOAT, [], [0.05]), helper.make_tensor("z", TensorProto.UINT8, [], [128]),
             helper.make_tensor("w", TensorProto.INT8, [8, 8], rng.integers(-50, 50, 64).tolist()),
             helper.make_tensor("sw", TensorProto.FLOAT, [], [0.01]), helper.make_tensor("zw", TensorProto.INT8, [], [0])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]), helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wd"]), helper.make_node("MatMul", ["xd", "wd"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "s", "z"], ["mq"]), helper.make_node("DequantizeLinear", ["mq", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "q.onnx"))
    assert bench.quantized_kernels(tmp_path / "q.onnx", tmp_path / "dump.onnx") == {"QLinearMatMul": 1}
