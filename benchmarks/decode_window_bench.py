"""graphopt::decode_attention with and without its key range (issue 17: a sliding window over a static cache).

One decode query over a static KV cache of --cache rows, the query at the last position: the split-K kernel
reading every row (the mask hides the ones outside the window) against the same kernel handed the key range
(key_positions / query_position / window, what graphopt/ops/fx_key_range.py proves from a model's mask), and the
causal bound alone with the query at the cache's middle. Mistral-7B's attention shape by default (32 query heads,
8 key/value heads, head 128), fp16, batch 1 and 8. Per case: the median of CUDA-event timings of --iters calls
(after a warm-up), the bytes of k and v the kernel must read, and the effective bandwidth; outputs checked equal.

    python benchmarks/decode_window_bench.py                         # CUDA (an H100: a few seconds)
    TRITON_INTERPRET=1 python benchmarks/decode_window_bench.py --smoke --device cpu   # the code path on a CPU, tiny

Output: a table; JSON at --out (a file or folder) or under $OUT when set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _case(batch: int, heads: int, kv_heads: int, head: int, cache: int, query: int, window: int, device: str, dtype: Any,
          iters: int) -> dict[str, Any]:
    import torch

    from graphopt.kernels.decode_attention import decode_attention_triton

    gen = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(batch, heads, 1, head, generator=gen).to(device, dtype)
    k = torch.randn(batch, kv_heads, cache, head, generator=gen).to(device, dtype)
    v = torch.randn(batch, kv_heads, cache, head, generator=gen).to(device, dtype)
    pos = torch.arange(cache, device=device)
    keep = pos <= query
    if window > 0:
        keep &= pos > query - window
    mask = keep.view(1, 1, 1, cache)
    ranged = (pos, torch.tensor([query], device=device), window)
    variants = {"whole cache": lambda: decode_attention_triton(q, k, v, mask),
                "key range": lambda: decode_attention_triton(q, k, v, mask, None, *ranged)}
    outputs = {name: fn() for name, fn in variants.items()}
    equal = float((outputs["whole cache"].float() - outputs["key range"].float()).abs().max())
    row_bytes = 2 * batch * kv_heads * head * k.element_size()  # one row of k and of v
    entry: dict[str, Any] = {"batch": batch, "cache": cache, "query": query, "window": window, "max_abs_difference": equal}
    for name, fn in variants.items():
        times = []
        for _ in range(3):
            fn()
        for _ in range(iters):
            if device.startswith("cuda"):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
        rows = cache if name == "whole cache" else int(keep.sum())
        us = statistics.median(times)
        entry[name] = {"us": us, "rows_read": rows, "gb_per_s": rows * row_bytes / us / 1e3}
    entry["speedup"] = entry["whole cache"]["us"] / entry["key range"]["us"]
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu (with TRITON_INTERPRET=1)")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head", type=int, default=128)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, 2 iterations (the code path, no figures)")
    parser.add_argument("--out", default=None, help="JSON file, or a folder (default: $OUT when set)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--device cpu runs the Triton kernel only under TRITON_INTERPRET=1")
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device")
    if min(args.heads, args.kv_heads, args.head, args.iters) < 1 or args.heads % args.kv_heads:
        parser.error("--heads, --kv-heads, --head, --iters must be >= 1 and --heads a multiple of --kv-heads")
    dtype = torch.float32 if device == "cpu" else torch.float16
    if args.smoke:
        heads, kv_heads, head, iters = 4, 2, 16, 2
        cases = [(1, 64, 63, 8), (2, 64, 31, -1)]
    else:
        heads, kv_heads, head, iters = args.heads, args.kv_heads, args.head, args.iters
        # (batch, cache rows, query position, window): Mistral's window of 4096 over a 32k cache, a short window,
        # and the causal bound alone (a full cache half written)
        cases = [(b, cache, query, window) for b in (1, 8)
                 for cache, query, window in ((32768, 32767, 4096), (4096, 4095, 256), (4096, 2047, -1))]
    results = [_case(b, heads, kv_heads, head, cache, query, window, device, dtype, iters) for b, cache, query, window in cases]
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu (TRITON_INTERPRET=1)"
    print(f"device: {gpu}; heads {heads}/{kv_heads}, head {head}, {dtype}")
    print(f"{'batch':>5} {'cache':>6} {'query':>6} {'window':>6} {'whole us':>9} {'GB/s':>6} {'range us':>9} {'GB/s':>6} {'speedup':>7} {'max diff':>9}")
    for e in results:
        whole, ranged = e["whole cache"], e["key range"]
        print(f"{e['batch']:>5} {e['cache']:>6} {e['query']:>6} {e['window']:>6} {whole['us']:>9.1f} {whole['gb_per_s']:>6.0f} "
              f"{ranged['us']:>9.1f} {ranged['gb_per_s']:>6.0f} {e['speedup']:>6.2f}x {e['max_abs_difference']:>9.2e}")
    out = args.out or os.environ.get("OUT")
    if out:
        path = Path(out)
        path = path / "decode_window_bench.json" if path.is_dir() or not path.suffix else path
        path.parent.mkdir(parents=True, exist_ok=True)
        env = {"torch": torch.__version__, "device": gpu, "dtype": str(dtype), "heads": heads, "kv_heads": kv_heads, "head": head,
               "iters": iters, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        path.write_text(json.dumps({"benchmark": "decode_window_bench", "environment": env, "results": results}, indent=1))
        print(f"wrote {path}")
    bad = [e for e in results if e["max_abs_difference"] > (1e-2 if dtype == torch.float16 else 1e-4)]
    if bad:
        print(f"outputs differ: {[(e['batch'], e['cache'], e['window']) for e in bad]}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
