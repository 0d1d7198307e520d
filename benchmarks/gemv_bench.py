"""Decode GEMVs (issue 17): graphopt::gemv_linear's Triton kernel against cuBLAS at TinyLlama-1.1B's
decode shapes, how close each streams its weight to the GPU's bandwidth, same GPU, same run.

Per (N, K) and rows M, each form computes x [M, K] @ W^T, W [N, K] as nn.Linear holds it:

  cublas      torch.nn.functional.linear (cuBLAS / cuBLASLt, what inductor's extern mm calls)
  triton      graphopt.kernels.gemv: every autotune config of the M regime (split-K as the
              launcher picks it for the shape, and unsplit too where it splits), and the
              autotuner's own pick ("auto")

Two timings of each:

  graph   a CUDA graph of --calls back-to-back calls, each on another of --rotate-mb of distinct
          weight copies (more than the 50 MB L2 of an H200, so W comes from HBM as in a decode
          step), replayed --replays times; the median replay / calls. No launch overhead: a
          decode step replays as one CUDA graph.
  do_bench  triton.testing.do_bench on one weight (its L2 flush before every call), median;
          includes the launch (and, for Triton, the autotuner's Python dispatch).

GB/s counts the weight's bytes (2NK) plus x and y; "x cuBLAS" is cuBLAS's time over the form's
(> 1: the Triton kernel is faster). The GPU's name comes first.

    python benchmarks/gemv_bench.py                            # all shapes, M = 1, 4, 8, 16 fp16, M = 1 bf16
    python benchmarks/gemv_bench.py --configs auto             # only the autotuner's pick (faster)
    TRITON_INTERPRET=1 python benchmarks/gemv_bench.py --device cpu --shapes 64x128 --rows 1,3 --calls 2
                                                               # a smoke test of the code paths (host clock)

Output: a short table last; JSON at --out (a file or a folder) or under $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
#: (name, N, K) of TinyLlama-1.1B's decode linears, q|k|v and gate|up packed (as graphopt packs them).
SHAPES = (("qkv", 2560, 2048), ("o_proj", 2048, 2048), ("gate_up", 11264, 2048), ("down", 2048, 5632), ("lm_head", 32000, 2048))
ROWS = (1, 4, 8, 16)


def _parse_shapes(text: str) -> list[tuple[str, int, int]]:
    shapes = []
    for item in text.split(","):
        n, _, k = item.partition("x")
        if not (n.isdigit() and k.isdigit()):
            raise ValueError(f"shape {item!r} is not NxK")
        shapes.append((item, int(n), int(k)))
    return shapes


def _graph_ms(calls: list[Callable[[], Any]], device: Any, replays: int) -> float:
    """Milliseconds per call: a CUDA graph of all the calls replayed (median of replays) on
    CUDA; the host clock per call elsewhere (the interpreter smoke test)."""
    import torch

    if device.type != "cuda":
        t0 = time.perf_counter()
        for call in calls:
            call()
        return (time.perf_counter() - t0) * 1e3 / len(calls)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls[:2]:  # compile / autotune off the capture
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / len(calls))
    del graph
    return statistics.median(times)


def _do_bench_ms(call: Callable[[], Any], device: Any) -> float | None:
    if device.type != "cuda":
        return None
    import triton.testing

    return float(triton.testing.do_bench(call, warmup=10, rep=50, return_mode="median"))


class Shape:
    """One (N, K) in one dtype: `copies` distinct weights (together more than the L2)."""

    def __init__(self, n: int, k: int, dtype: Any, args: argparse.Namespace) -> None:
        import torch

        self.n, self.k, self.dtype, self.device = n, k, dtype, torch.device(args.device)
        gen = torch.Generator().manual_seed(n * 7 + k)
        weight = (torch.randn(n, k, generator=gen) / k**0.5).to(self.device, dtype)
        self.weight_bytes = weight.numel() * weight.element_size()
        copies = 2 if args.device == "cpu" else max(2, min(args.calls, -(-(args.rotate_mb << 20) // self.weight_bytes)))
        self.weights = [weight] + [weight.clone() for _ in range(copies - 1)]


def _calls(shape: Shape, form: str, x: Any, calls: int, **launch: Any) -> list[Callable[[], Any]]:
    import torch.nn.functional as F

    from graphopt.kernels.gemv import gemv_linear_triton

    made: list[Callable[[], Any]] = []
    for i in range(calls):
        w = shape.weights[i % len(shape.weights)]
        if form == "cublas":
            made.append(lambda w=w: F.linear(x, w))
        else:
            made.append(lambda w=w: gemv_linear_triton(x, w, None, **launch))
    return made


def _config_name(config: dict[str, int] | None, split: int | None) -> str:
    if config is None:
        return "auto"
    name = f"{'dot' if config['USE_DOT'] else 'sum'} N{config['BLOCK_N']}xK{config['BLOCK_K']} w{config['num_warps']} s{config['num_stages']}"
    return name + (f" split{split}" if split is not None else "")


def _relative_error(got: Any, want: Any) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6))


def bench_shape(name: str, shape: Shape, m: int, args: argparse.Namespace, deadline: float) -> list[dict[str, Any]]:
    import torch

    from graphopt.kernels import gemv

    dtype_name = str(shape.dtype).removeprefix("torch.")
    x = torch.randn(m, shape.k, generator=torch.Generator().manual_seed(m)).to(shape.device, shape.dtype)
    moved = shape.weight_bytes + (m * shape.k + m * shape.n) * x.element_size()
    rows: list[dict[str, Any]] = []

    def record(form: str, config: str, calls: list[Callable[[], Any]]) -> None:
        graph_ms = _graph_ms(calls, shape.device, args.replays)
        bench_ms = _do_bench_ms(calls[0], shape.device) if args.do_bench else None
        rows.append({"shape": name, "N": shape.n, "K": shape.k, "M": m, "dtype": dtype_name, "form": form, "config": config,
                     "ms": graph_ms, "GB/s": moved / (graph_ms * 1e-3) / 1e9, "do_bench_ms": bench_ms,
                     "do_bench_GB/s": None if bench_ms is None else moved / (bench_ms * 1e-3) / 1e9, "bytes": moved})

    record("cublas", "F.linear", _calls(shape, "cublas", x, args.calls))
    want = torch.nn.functional.linear(x.float(), shape.weights[0].float())
    split = gemv.split_for(m, shape.n, shape.k, shape.device)
    launches: list[tuple[dict[str, int] | None, int | None]] = [(None, None)]
    if args.configs == "all" and time.monotonic() < deadline:
        configs = gemv.CONFIGS[gemv.regime(m)]
        # --splits auto: the launcher's split (and unsplit where it splits); else each config at every split listed
        splits: list[int | None] = (sorted({split, 1}) if split > 1 else [None]) if args.splits == "auto" else args.split_list
        launches += [(c, s) for c in configs for s in splits]
    for config, split_k in launches:
        try:
            calls = _calls(shape, "triton", x, args.calls, config=config, split_k=split_k)
            error = _relative_error(calls[0](), want)
            if error > 1e-2:  # a wrong kernel's speed means nothing
                raise ValueError(f"output differs from fp32 linear by {error:.2e} (relative)")
            record("triton", _config_name(config, split_k), calls)
        except Exception as error:  # noqa: BLE001 - a config that fails to compile, run or check is reported
            rows.append({"shape": name, "N": shape.n, "K": shape.k, "M": m, "dtype": dtype_name, "form": "triton",
                         "config": _config_name(config, split_k), "error": f"{type(error).__name__}: {error}"[:200]})
    cublas = rows[0]
    for row in rows:
        if "ms" in row:
            row["x cuBLAS"] = cublas["ms"] / row["ms"]
            if row["do_bench_ms"] and cublas["do_bench_ms"]:
                row["do_bench x cuBLAS"] = cublas["do_bench_ms"] / row["do_bench_ms"]
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Per (shape, M, dtype): cuBLAS, the autotuner's pick and the best config (graph timings; do_bench in brackets)."""
    lines = [f"{'shape':8s} {'N':>6s} {'K':>5s} {'M':>3s} {'dtype':8s} {'cuBLAS us':>9s} {'GB/s':>6s} {'auto us':>8s} {'GB/s':>6s} "
             f"{'x cuBLAS':>8s} {'best us':>8s} {'x cuBLAS':>8s}  best config  [do_bench us: cuBLAS / auto]"]
    keys = list(dict.fromkeys((r["shape"], r["M"], r["dtype"]) for r in rows))
    for shape, m, dtype in keys:
        group = [r for r in rows if (r["shape"], r["M"], r["dtype"]) == (shape, m, dtype) and "ms" in r]
        cublas = next((r for r in group if r["form"] == "cublas"), None)
        triton_rows = [r for r in group if r["form"] == "triton"]
        if cublas is None or not triton_rows:
            continue
        auto = next((r for r in triton_rows if r["config"] == "auto"), None)
        best = min(triton_rows, key=lambda r: r["ms"])
        bench = (f"[{_fmt(cublas['do_bench_ms'] and cublas['do_bench_ms'] * 1e3, '.1f')} / "
                 f"{_fmt(auto and auto['do_bench_ms'] and auto['do_bench_ms'] * 1e3, '.1f')}]")
        lines.append(f"{shape:8s} {cublas['N']:6d} {cublas['K']:5d} {m:3d} {dtype:8s} {cublas['ms'] * 1e3:9.2f} {cublas['GB/s']:6.0f} "
                     f"{_fmt(auto and auto['ms'] * 1e3, '8.2f')} {_fmt(auto and auto['GB/s'], '6.0f')} "
                     f"{_fmt(auto and auto['x cuBLAS'], '8.2f')} {best['ms'] * 1e3:8.2f} {best['x cuBLAS']:8.2f}  {best['config']}  {bench}")
    errors = sorted({f"{r['shape']} M={r['M']} {r['dtype']} {r.get('config', '')}: {r['error']}" for r in rows if "error" in r})
    return lines + [f"error: {e}" for e in errors[:12]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--shapes", default=None, help="NxK,... (default: TinyLlama's five decode shapes, packed)")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="M values in fp16 (default 1,4,8,16)")
    parser.add_argument("--bf16-rows", default="1", help="M values in bf16 (default 1; '' for none)")
    parser.add_argument("--configs", default="all", choices=("all", "auto"))
    parser.add_argument("--splits", default="auto", help="split-K per config: 'auto' (the launcher's pick) or a list, e.g. 1,2,4")
    parser.add_argument("--calls", type=int, default=200, help="calls captured in one CUDA graph")
    parser.add_argument("--rotate-mb", type=int, default=200, help="weight bytes each graph cycles through (> the L2)")
    parser.add_argument("--replays", type=int, default=5)
    parser.add_argument("--no-do-bench", dest="do_bench", action="store_false", help="graph timings only")
    parser.add_argument("--budget-s", type=float, default=150.0, help="no new (shape, M) starts after this; config sweeps stop at 70%%")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    try:
        shapes = _parse_shapes(args.shapes) if args.shapes else list(SHAPES)
        fp16_rows = [int(v) for v in args.rows.split(",") if v]
        bf16_rows = [int(v) for v in args.bf16_rows.split(",") if v]
        args.split_list = [] if args.splits == "auto" else [int(v) for v in args.splits.split(",") if v]
        if args.splits != "auto" and (not args.split_list or min(args.split_list) < 1):
            raise ValueError("--splits takes 'auto' or positive ints")
        if any(m < 1 for m in fp16_rows + bf16_rows) or args.calls < 2 or args.replays < 1:
            raise ValueError("rows >= 1, calls >= 2, replays >= 1")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("error: --device cpu runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    import torch
    import triton

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device (use --device cpu with TRITON_INTERPRET=1 for a smoke test)", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (Triton interpreter)"
    print(f"device: {gpu}", flush=True)
    header = {"device": gpu, "torch": torch.__version__, "triton": triton.__version__, "calls": args.calls,
              "rotate_mb": args.rotate_mb, "replays": args.replays, "command": " ".join(sys.argv)}
    if args.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        header.update(sms=props.multi_processor_count, l2_mb=getattr(props, "L2_cache_size", 0) / 2**20)
    print(" | ".join(f"{k}: {v}" for k, v in header.items()), flush=True)
    start = time.monotonic()
    results: list[dict[str, Any]] = []
    runs = [(torch.float16, m) for m in fp16_rows] + [(torch.bfloat16, m) for m in bf16_rows]
    for name, n, k in shapes:
        if time.monotonic() - start > args.budget_s:
            print(f"budget: {name} and later shapes not measured", flush=True)
            break
        for dtype in dict.fromkeys(d for d, _ in runs):
            shape = Shape(n, k, dtype, args)
            for m in [m for d, m in runs if d == dtype]:
                rows = bench_shape(name, shape, m, args, deadline=start + 0.7 * args.budget_s)
                results += rows
                print("\n".join(summary(rows)[1:]), flush=True)
            del shape
            if args.device == "cuda":
                torch.cuda.empty_cache()
    table = summary(results)
    print(f"\n{gpu}, torch {torch.__version__}, triton {triton.__version__}, {args.calls} calls a graph over "
          f"{args.rotate_mb} MB of weights, {time.monotonic() - start:.0f} s\n" + "\n".join(table))
    target = args.out or os.environ.get("OUT")
    if target:
        out = Path(target)
        path = out / "gemv_bench.json" if out.suffix != ".json" else out
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**header, "results": results}, indent=1))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
