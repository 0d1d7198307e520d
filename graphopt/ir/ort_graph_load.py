"""One onnxruntime load of a model's graph (the session graphopt.ir.runtime_check makes), and
onnxruntime's error text on one line."""

from __future__ import annotations

from typing import Any

__all__ = ["load_error", "error_text"]


def error_text(error: BaseException) -> str:
    """An exception's words on one line, without onnxruntime's prefix."""
    return " ".join(str(error).split()).replace("[ONNXRuntimeError] : ", "")


def load_error(ort: Any, model: bytes | str) -> str | None:
    """Why onnxruntime (CPU, optimizations off) refuses the graph (serialized bytes or a path), or None.

    The one error tolerated is a missing kernel (NOT_IMPLEMENTED): it comes after graph
    resolution, and is expected for CUDA-only ops on a CPU-only build."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    # The session only resolves the graph, it never runs: no thread pools (their start
    # was most of the check's time on a small model, ~3 ms of ~4).
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    try:
        ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - onnxruntime's errors have no useful classes
        text = error_text(error)
        if "NOT_IMPLEMENTED" in text:  # graph resolution passed; a kernel is missing (CUDA-only ops)
            return None
        return text
    return None
