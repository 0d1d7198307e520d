"""The capability tables: what each target may be given, checked against onnxruntime itself."""

from __future__ import annotations

import onnxruntime
import pytest

from graphopt.errors import GraphoptError
from graphopt.ops.snapshot_ort_kernels import snapshot
from graphopt.ops.targets import TARGETS, get_target


def test_cpu_table_is_the_installed_onnxruntimes() -> None:
    """The ort-cpu table is read from the onnxruntime graphopt runs with, not a snapshot of
    another version: 1.32 dropped ReduceLogSum's integer kernels that 1.31 had."""
    live = snapshot("CPUExecutionProvider")
    target = TARGETS["ort-cpu"]
    assert target.confirmed and onnxruntime.__version__ in target.kernel_source
    table = target.kernels
    live_keys = {tuple(k.split("::", 1)) for k in live["kernels"]}
    assert set(table) == live_keys
    # Every kernel the table promises exists in the onnxruntime we test with, for every dtype.
    for key, dtypes in table.items():
        assert dtypes == set(live["kernels"]["::".join(key)]), key
    cpu = get_target("ort-cpu")
    for dtype in ("i32", "i64"):
        has = dtype in live["kernels"].get("::ReduceLogSum", [])
        assert (cpu.why_not("", "ReduceLogSum", dtype, 18) is None) == has


def test_the_onnx_target_lowers_only_to_ops_the_installed_onnxruntime_runs() -> None:
    """QuickGelu -> Swish (opset 24) on --target onnx only where onnxruntime has a Swish kernel (1.32 has none)."""
    live = snapshot("CPUExecutionProvider")
    has_swish = any(a <= 24 <= b for a, b in live["ranges"].get("::Swish", []))
    reason = get_target("onnx").why_not("graphopt", "QuickGelu", "f32", 24)
    assert (reason is None) == has_swish, reason
    assert get_target("onnx").why_not("graphopt", "MultiHeadAttention", "f32", 23) is None  # Attention-23 has a kernel


def test_the_kernel_table_is_cached_per_onnxruntime_build(tmp_path, monkeypatch) -> None:
    from graphopt.ops.snapshot_ort_kernels import installed_kernels

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = installed_kernels("CPUExecutionProvider")
    [cached] = (tmp_path / "graphopt").iterdir()
    assert onnxruntime.__version__ in cached.name
    assert installed_kernels("CPUExecutionProvider") == first == snapshot("CPUExecutionProvider")


def test_a_cuda_table_that_cannot_be_confirmed_says_so() -> None:
    """A CPU-only onnxruntime does not register the CUDA provider: the table is graphopt's own,
    and a report of an ort-cuda run that emitted something says it is unconfirmed."""
    from conftest import conv_bn_model

    import graphopt
    from graphopt.ops.snapshot_ort_kernels import registry_providers

    target = TARGETS["ort-cuda"]
    assert target.confirmed == ("CUDAExecutionProvider" in registry_providers())
    _, report = graphopt.optimize(conv_bn_model(), target="ort-cuda")
    assert report.total_rewrites > 0
    unconfirmed = [w for w in report.warnings if "not confirmed" in w]
    assert bool(unconfirmed) == (not target.confirmed), report.warnings


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_every_lowering_lands_on_a_kernel_of_its_target(target: str) -> None:
    t = TARGETS[target]
    for op in t.lowerings:
        lowered = t.lowered("graphopt", op)
        assert lowered in t.kernels, f"{target}: graphopt.{op} lowers to {lowered}, which has no kernel"


def test_onnx_target_refuses_contrib_and_graphopt_ops() -> None:
    onnx_target = get_target("onnx")
    assert onnx_target.why_not("com.microsoft", "FusedConv", "f32", 17) is not None
    assert onnx_target.why_not("graphopt", "FusedConv", "f32", 17) is not None
    assert onnx_target.why_not("", "Gemm", "f16", 17) is None  # standard ONNX op
    assert onnx_target.why_not("", "NotAnOp", "f32", 17) is not None
    # Ops newer than the model's opset are refused.
    assert onnx_target.why_not("", "LayerNormalization", "f32", 13) is not None
    assert onnx_target.why_not("", "LayerNormalization", "f32", 17) is None


def test_ort_cpu_refuses_dtypes_without_a_kernel() -> None:
    cpu = get_target("ort-cpu")
    assert cpu.why_not("", "Gemm", "f32", 17) is None
    assert "no Gemm kernel for f16" in (cpu.why_not("", "Gemm", "f16", 17) or "")
    assert cpu.why_not("graphopt", "FusedConv", "f32", 17) is None
    assert cpu.why_not("graphopt", "FusedConv", "f16", 17) is not None


def test_unknown_target_is_a_clear_error() -> None:
    with pytest.raises(GraphoptError, match="unknown target 'tensorrt'"):
        get_target("tensorrt")


def test_a_gpu_build_registry_is_read_in_a_child_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # Listing a GPU build's kernels loads every provider library (TensorRT's too) and crashed
    # the process on the H100 machine: such a build is read in a child; a crash there means
    # the shipped table (None), never a crash of graphopt.
    import subprocess

    import onnxruntime

    from graphopt.ops import snapshot_ort_kernels as kernels

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    table = kernels._read_registry("CPUExecutionProvider")
    assert table is not None and "::Relu" in table["kernels"]

    def crashed(*args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess([], -11, "", "Segmentation fault")

    monkeypatch.setattr(kernels.subprocess, "run", crashed)
    assert kernels._read_registry("CPUExecutionProvider") is None


def test_ort_cpu_refuses_ops_marked_slower_than_composed() -> None:
    """The registry's slower_on_ort_cpu ops (Softplus) are refused for ort-cpu only; a graphopt op is
    judged by the kernel it lowers to."""
    import dataclasses

    cpu = get_target("ort-cpu")
    assert "slower than the ops it would replace" in (cpu.slower_kernel("", "Softplus") or "")
    assert cpu.slower_kernel("", "Exp") is None
    assert get_target("ort-cuda").slower_kernel("", "Softplus") is None
    marked = dataclasses.replace(cpu, slower_than_composed=frozenset({("com.microsoft", "SkipLayerNormalization")}))
    assert "com.microsoft.SkipLayerNormalization" in (marked.slower_kernel("graphopt", "SkipLayerNorm") or "")
