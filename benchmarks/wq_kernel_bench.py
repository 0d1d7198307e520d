"""Weight-only int4/int8 matmul kernels at decode shapes (issue 18): how close to the GPU's
bandwidth each form streams its weights, against fp16 cuBLAS, same GPU, same run.

Per TinyLlama-1.1B linear shape (N, K) and rows M (decode at batch M), each form computes
x [M, K] @ W^T (W [N, K] as nn.Linear holds it) and is timed inside a CUDA graph that calls it
on --rotate-mb of distinct weight copies (so the weights come from HBM, as in a decode step,
not from the 50 MB L2), the graph's time divided by the calls:

  fp16        torch.mm on fp16 weights (cuBLAS)
  int4, int8  graphopt::wq_linear as it runs now (wq_matmul.wq_linear_triton), blocks of
              --block-size, symmetric: at M <= 16 the decode GEMV (graphopt.kernels.wq_gemv):
              the autotuner's own pick ("auto") and, with --configs all (or m1: at M = 1 only),
              every config it offers for the shape, the best reported with its config
  int4-old,   the tiled kernel of graphopt.kernels.wq_matmul forced (kernel="tiled": its M = 1
  int8-old    GEMV and M <= 16 dot configs, autotuned): the regime the decode GEMV replaces
  int4pack    torch._weight_int4pack_mm (tinygemm; bf16 activations, the form graphopt casts to)

GB/s counts the bytes of the weight as the form stores it (packed values and scales; fp16 2NK);
"x fp16" is fp16's time over the form's (> 1: faster).

    python benchmarks/wq_kernel_bench.py                          # TinyLlama's shapes, M = 1, 8, 16 (CUDA)
    python benchmarks/wq_kernel_bench.py --configs auto           # only the autotuned pick (faster)
    TRITON_INTERPRET=1 python benchmarks/wq_kernel_bench.py --device cpu --shapes 64x128 --rows 1,3
                                                                  # a smoke test of the code paths (host clock)

Output: a short table with the GPU's name and versions; JSON at --out (a file or a folder) or under $OUT.
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
#: (name, N, K) of TinyLlama-1.1B's linears as its decode runs them (q|k|v and gate|up packed by graphopt's
#: fx passes); the unpacked ones and the LM head (kept fp16) through --shapes, e.g. 256x2048,5632x2048,32000x2048.
SHAPES = (("qkv", 2560, 2048), ("gate/up", 11264, 2048), ("down", 2048, 5632), ("o", 2048, 2048))
ROWS = (1, 8, 16)
L2_BYTES = 50 << 20


def _parse_shapes(text: str) -> list[tuple[str, int, int]]:
    shapes = []
    for item in text.split(","):
        n, _, k = item.partition("x")
        if not (n.isdigit() and k.isdigit()):
            raise ValueError(f"shape {item!r} is not NxK")
        shapes.append((item, int(n), int(k)))
    return shapes


def _time_calls(calls: list[Callable[[], Any]], device: Any, replays: int) -> float:
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


def _copies(bytes_per_copy: int, args: argparse.Namespace) -> int:
    """Distinct weight copies for one graph: --rotate-mb of them (at least 3 L2s), 2 to 1024."""
    if args.device == "cpu":
        return 2
    return max(2, min(1024, -(-(args.rotate_mb << 20) // max(bytes_per_copy, 1))))


def _relative_error(got: Any, want: Any) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6))


def _nbytes(*tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class Shape:
    """One (N, K): the fp16 weight and its quantized forms, each as `copies` distinct tensors."""

    def __init__(self, n: int, k: int, args: argparse.Namespace) -> None:
        import numpy as np
        import torch

        from graphopt.passes.fx_weight_quant_forms import int4pack_weight
        from graphopt.quant import blockwise

        self.n, self.k, self.device = n, k, torch.device(args.device)
        gen = torch.Generator().manual_seed(n * 7 + k)
        weight = torch.randn(n, k, generator=gen) / k**0.5  # [N, K]
        self.forms: dict[str, list[tuple[Any, ...]]] = {}
        self.bytes: dict[str, int] = {}
        fp16 = weight.to(self.device, torch.float16)
        self._replicate("fp16", (fp16,), args)
        for bits in args.bits:
            q = blockwise.quantize(weight.t().numpy().astype(np.float32), bits, args.block_size, symmetric=True)
            packed = torch.from_numpy(np.ascontiguousarray(blockwise.pack(q.q, bits))).to(self.device)
            scales = torch.from_numpy(q.scales.astype(np.float32)).to(self.device, torch.float16)
            self._replicate(f"int{bits}", (packed, scales), args)
            if bits == 4 and self.device.type == "cuda":
                tiny = int4pack_weight(q, self.device)
                if tiny is not None:
                    self._replicate("int4pack", tiny, args)

    def _replicate(self, form: str, tensors: tuple[Any, ...], args: argparse.Namespace) -> None:
        self.bytes[form] = _nbytes(*tensors)
        copies = _copies(self.bytes[form], args)
        self.forms[form] = [tensors] + [tuple(t.clone() for t in tensors) for _ in range(copies - 1)]


def _gemm_calls(shape: Shape, form: str, x: Any, **launch: Any) -> list[Callable[[], Any]]:
    import torch

    from graphopt.kernels.wq_matmul import wq_linear_triton

    calls: list[Callable[[], Any]] = []
    xb = x.to(torch.bfloat16)  # tinygemm takes bf16 rows
    for tensors in shape.forms[form]:
        if form == "fp16":
            calls.append(lambda w=tensors[0]: torch.mm(x, w.t()))
        elif form == "int4pack":
            calls.append(lambda t=tensors: torch._weight_int4pack_mm(xb, t[0], BLOCK_SIZE[0], t[1]))
        else:
            bits = int(form[3:4])
            calls.append(lambda t=tensors, b=bits: wq_linear_triton(x, t[0], t[1], None, None, b, BLOCK_SIZE[0], shape.k, **launch))
    return calls


BLOCK_SIZE = [32]  # set from --block-size (the calls read it)


def _config_name(config: dict[str, int] | None, split: int | None) -> str:
    if config is None:
        return "auto"
    if "K_WORDS" in config:
        return f"N{config['BLOCK_N']}xKW{config['K_WORDS']} split{config['SPLIT_K']} w{config['num_warps']} s{config['num_stages']}"
    name = f"M{config['BLOCK_M']}xN{config['BLOCK_N']}xK{config['BLOCK_K']} w{config['num_warps']} s{config['num_stages']}"
    return name + (f" split{split}" if split is not None else "")


def bench_shape(name: str, shape: Shape, m: int, args: argparse.Namespace, deadline: float) -> list[dict[str, Any]]:
    import torch

    from graphopt.kernels import wq_matmul

    x = torch.randn(m, shape.k, generator=torch.Generator().manual_seed(m)).to(shape.device, torch.float16)
    rows: list[dict[str, Any]] = []

    def record(form: str, config: str, ms: float) -> dict[str, Any]:
        row = {"shape": name, "N": shape.n, "K": shape.k, "M": m, "form": form, "config": config, "ms": ms,
               "GB/s": shape.bytes[form] / (ms * 1e-3) / 1e9, "weight_bytes": shape.bytes[form]}
        rows.append(row)
        return row

    fp16 = record("fp16", "cuBLAS", _time_calls(_gemm_calls(shape, "fp16", x), shape.device, args.replays))
    if "int4pack" in shape.forms:
        try:
            calls = _gemm_calls(shape, "int4pack", x)
            want = wq_matmul.wq_linear_reference(x, *shape.forms["int4"][0], None, None, 4, args.block_size, shape.k)
            error = _relative_error(calls[0](), want)
            if error > 3e-2:  # bf16 rows and scales; more is a packing error (nibble order, scales_and_zeros)
                raise ValueError(f"output differs from the int4 reference by {error:.2e} (relative)")
            record("int4pack", "tinygemm", _time_calls(calls, shape.device, args.replays))
        except Exception as error:  # noqa: BLE001 - a form that cannot run is reported, not fatal
            rows.append({"shape": name, "M": m, "form": "int4pack", "error": f"{type(error).__name__}: {error}"[:200]})
    from graphopt.kernels import wq_gemv

    reference = {f"int{bits}": wq_matmul.wq_linear_reference(x, *shape.forms[f"int{bits}"][0], None, None, bits, args.block_size, shape.k)
                 for bits in args.bits}
    sweep = args.configs == "all" or (args.configs == "m1" and m == 1)
    for bits in args.bits:
        form = f"int{bits}"
        # (form label, launch keywords): the op's own pick, the old regime's, then the decode GEMV's configs
        launches: list[tuple[str, dict[str, Any]]] = [(form, {}), (f"{form}-old", {"kernel": "tiled"})]
        if m <= wq_gemv.GEMV_MAX_M and sweep and time.monotonic() < deadline:
            launches += [(form, {"config": c}) for c in wq_gemv.configs_for(m, wq_gemv.splits_offered(shape.n, shape.device))]
        for label, launch in launches:
            config = launch.get("config")
            try:
                calls = _gemm_calls(shape, form, x, **launch)
                error = _relative_error(calls[0](), reference[form])
                if error > 1e-2:  # a wrong kernel's speed means nothing
                    raise ValueError(f"output differs from the reference by {error:.2e} (relative)")
                ms = _time_calls(calls, shape.device, args.replays)
            except Exception as error:  # noqa: BLE001 - a config that fails to compile, run or check is reported
                rows.append({"shape": name, "M": m, "form": label, "config": _config_name(config, None),
                             "error": f"{type(error).__name__}: {error}"[:200]})
                continue
            shape.bytes.setdefault(label, shape.bytes[form])
            record(label, _config_name(config, None), ms)
    for row in rows:
        if "ms" in row:
            row["x fp16"] = fp16["ms"] / row["ms"]
    return rows


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """One line per (shape, M, form): the best config's time, GB/s and ratio; the autotuner's pick."""
    lines = [f"{'shape':9s} {'N':>6s} {'K':>5s} {'M':>3s} {'form':9s} {'us':>8s} {'GB/s':>7s} {'x fp16':>7s}  best config (auto: us)"]
    keys = list(dict.fromkeys((r["shape"], r["M"], r["form"]) for r in rows if "ms" in r))  # in measuring order
    for shape, m, form in keys:
        group = [r for r in rows if (r["shape"], r["M"], r["form"]) == (shape, m, form) and "ms" in r]
        best = min(group, key=lambda r: r["ms"])
        auto = next((r for r in group if r["config"] == "auto"), None)
        tail = best["config"] + (f" (auto: {auto['ms'] * 1e3:.1f})" if auto is not None and form.startswith("int") and form != "int4pack" else "")
        lines.append(f"{shape:9s} {best['N']:6d} {best['K']:5d} {m:3d} {form:9s} {best['ms'] * 1e3:8.1f} {best['GB/s']:7.0f} "
                     f"{best['x fp16']:7.2f}  {tail}")
    errors = sorted({f"{r['shape']} M={r['M']} {r['form']} {r.get('config', '')}: {r['error']}" for r in rows if "error" in r})
    return lines + [f"error: {e}" for e in errors[:12]]


def comparison(rows: list[dict[str, Any]]) -> list[str]:
    """Per (shape, M): fp16's time, then each form's best time as "us (x fp16, GB/s)"; new against old."""
    forms = [f for f in ("int4", "int4-old", "int8", "int8-old", "int4pack") if any(r.get("form") == f and "ms" in r for r in rows)]
    lines = [f"{'shape':8s} {'M':>3s} {'fp16 us':>8s}  " + "  ".join(f"{f:>20s}" for f in forms) + "  int4 new/old  int8 new/old"]
    for shape, m in dict.fromkeys((r["shape"], r["M"]) for r in rows if "ms" in r):
        best: dict[str, dict[str, Any]] = {}
        for r in rows:
            if (r["shape"], r["M"]) == (shape, m) and "ms" in r and (r["form"] not in best or r["ms"] < best[r["form"]]["ms"]):
                best[r["form"]] = r
        if "fp16" not in best:
            continue
        cells = [f"{best[f]['ms'] * 1e3:6.1f} ({best[f]['x fp16']:4.2f}x,{best[f]['GB/s']:5.0f})" if f in best else f"{'-':>20s}" for f in forms]
        speedups = [f"{best[f'int{b}-old']['ms'] / best[f'int{b}']['ms']:12.2f}" if f"int{b}" in best and f"int{b}-old" in best else f"{'-':>12s}"
                    for b in (4, 8)]
        lines.append(f"{shape:8s} {m:3d} {best['fp16']['ms'] * 1e3:8.1f}  " + "  ".join(cells) + "  " + "  ".join(speedups))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--shapes", default=None, help="NxK,... (default: TinyLlama's five linear shapes)")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="M values (default 1,8,16)")
    parser.add_argument("--bits", default="4,8")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--configs", default="all", choices=("all", "m1", "auto"),
                        help="sweep the decode GEMV's configs at every M (all), at M = 1 only (m1), or time only the autotuners' picks")
    parser.add_argument("--rotate-mb", type=int, default=160, help="weight bytes each timed graph cycles through (> the L2)")
    parser.add_argument("--replays", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=150.0, help="no new (shape, M) starts after this; configs sweeps stop earlier")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    try:
        shapes = _parse_shapes(args.shapes) if args.shapes else list(SHAPES)
        rows_m = [int(v) for v in args.rows.split(",")]
        args.bits = [int(v) for v in args.bits.split(",")]
        if any(b not in (4, 8) for b in args.bits) or any(m < 1 for m in rows_m):
            raise ValueError("bits are 4 or 8, rows >= 1")
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
    BLOCK_SIZE[0] = args.block_size
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (Triton interpreter)"
    header = {"device": gpu, "torch": torch.__version__, "triton": triton.__version__, "block_size": args.block_size,
              "rotate_mb": args.rotate_mb, "int4pack_schema": str(torch.ops.aten._weight_int4pack_mm.default._schema),
              "convert_schema": str(torch.ops.aten._convert_weight_to_int4pack.default._schema)}
    print(" | ".join(f"{k}: {v}" for k, v in header.items()), flush=True)
    start = time.monotonic()
    results: list[dict[str, Any]] = []
    # M outer: every shape at one row (the decode goal) before batch 8 and 16; the weights built once
    built = {name: Shape(n, k, args) for name, n, k in shapes}
    for m in rows_m:
        for name, shape in built.items():
            if time.monotonic() - start > args.budget_s:
                print(f"budget: {name} at M={m} not measured", flush=True)
                results.append({"shape": name, "M": m, "form": "-", "error": "not started: past the budget"})
                continue
            # the config sweep stops at 70% of the budget: the auto pick and the baselines still run
            rows = bench_shape(name, shape, m, args, deadline=start + 0.7 * args.budget_s)
            results += rows
            print("\n".join(summary(rows)[1:]), flush=True)
    table = summary(results)
    print(f"\n{gpu}, torch {torch.__version__}, triton {triton.__version__}, block {args.block_size}, "
          f"{time.monotonic() - start:.0f} s\n" + "\n".join(table))
    print("\nus (x fp16, GB/s of the weight as stored), best config of each form:\n" + "\n".join(comparison(results)))
    out = Path(args.out or os.environ.get("OUT", ".")) if (args.out or os.environ.get("OUT")) else None
    if out is not None:
        path = out / "wq_kernel_bench.json" if out.suffix != ".json" else out
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**header, "results": results}, indent=1))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
