"""The clock of graphopt's compile-time choices: a call's time as a decode step pays it.

A decode step replays as a CUDA graph and reads its weights from HBM, so a candidate kernel is
timed the same way: captured in a CUDA graph (no Python dispatch counted) and replayed after the
L2 is flushed (a layer's weights fit an H100/H200's 50 MB L2; timed repeatedly without the flush
they would measure an L2-bound matmul). Off CUDA the host clock times the call itself, after a
buffer larger than the CPU's last-level cache is written (the same reason: a step's weights come
from memory). Used by fx_weight_quant_forms (which form a quantized
matmul takes) and wq_matmul (which kernel a decode shape runs).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["gpu_time_ms", "release_timing_buffers", "L2_FLUSH_BYTES"]

#: Bytes written between two timed runs on CUDA: more than an H100/H200's L2 (50 MB), so every
#: run reads its weights from HBM as a decode step does (a model's weights never fit the L2).
L2_FLUSH_BYTES = 256 << 20
_FLUSH: dict[torch.device, torch.Tensor] = {}


def _cpu_flush_bytes() -> int:
    """Twice the last-level cache where the OS says (64 MiB at least)."""
    try:
        l3 = int(os.sysconf("SC_LEVEL3_CACHE_SIZE"))
    except (ValueError, OSError, AttributeError):
        l3 = 0
    return max(64 << 20, 2 * l3)


def _flush_l2(device: torch.device) -> None:
    buffer = _FLUSH.get(device)
    if buffer is None:
        buffer = _FLUSH[device] = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    buffer.zero_()


def release_timing_buffers() -> None:
    """Free the flush buffer (once a graph's candidates are timed)."""
    _FLUSH.clear()


def gpu_time_ms(fn: Callable[[], Any], runs: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of one call: on CUDA the replay of a CUDA graph of it (the GPU's time,
    as a decode step replayed by CUDA graphs pays it, without the Python dispatch) after the L2
    is flushed (the flush also keeps the GPU busy while the replay is queued, so no host time is
    counted), else of the call itself, after the CPU's cache is flushed; the host clock off CUDA."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        times = []
        cpu = torch.device("cpu")
        for i in range(warmup + runs):
            if i >= warmup:
                buffer = _FLUSH.get(cpu)
                if buffer is None:
                    buffer = _FLUSH[cpu] = torch.zeros(_cpu_flush_bytes() // 4, dtype=torch.int32)
                buffer.add_(1)
            t0 = time.perf_counter()
            fn()
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream, as capture wants
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    run: Callable[[], Any] = fn
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    except Exception:  # noqa: BLE001 - a form that cannot be captured is timed as it is
        torch.cuda.synchronize()
    times = []
    device = torch.device("cuda", torch.cuda.current_device())
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _flush_l2(device)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
