"""The GPU kernels a benchmark's call runs, from torch.profiler (CUPTI sees every library's
kernels in the process: torch's, Triton's, onnxruntime's), shared by gpu_fusions.py and
torch_compile.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def kernel_profile(call: Callable[[], Any], runs: int = 10, top: int = 25) -> dict[str, Any]:
    """`runs` calls of `call` (kernels replayed from CUDA graphs included): per run, the kernel
    count, the summed kernel time, and the `top` kernels that take the most time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            call()
        if torch.cuda.is_initialized():  # torch's own launches are asynchronous
            torch.cuda.synchronize()
    by_name: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type.name == "CUDA" and event.device_time_total > 0:
            by_name.setdefault(event.name, []).append(event.device_time_total)
    total_us = sum(sum(v) for v in by_name.values())
    rows = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    return {"kernels_per_run": round(sum(len(v) for v in by_name.values()) / runs, 1),
            "gpu_ms_per_run": round(total_us / runs / 1e3, 4),
            "top": [{"name": name[:120], "calls_per_run": round(len(v) / runs, 1), "ms_per_run": round(sum(v) / runs / 1e3, 4)}
                    for name, v in rows[:top]]}
