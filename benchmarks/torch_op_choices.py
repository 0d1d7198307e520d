"""The op-level choices graphopt's torch lowering makes, measured on the GPU (issue 4).

Each *case* times two or more ways to compute the same thing, as the torch backend could
emit them, and checks that they agree:

  lm_head     x @ W^T with an unaligned N (GPT-2's vocabulary, 50257): as is, against W
              padded to a multiple of 8 rows (the result sliced back, a view)
  qkv         three projections of one input (BERT, ViT) against one packed GEMM, split
  epilogue    addmm then the activation, against cuBLASLt's fused epilogue
              (aten._addmm_activation: ReLU, or GELU with the tanh approximation)
  conv        every convolution of torchvision's ResNet-50 (b32, fp16, channels-last), with
              its bias and ReLU (and the residual add where the block has one): the conv
              then one fused pointwise kernel (what inductor emits), against cuDNN's fused
              conv-bias-(add-)ReLU (aten.cudnn_convolution_relu / _add_relu); weighted by
              how often each shape occurs in the model

Times are GPU times (each call replayed from a CUDA graph, L2 flushed in between; medians),
from benchmarks/triton_kernels.py's Timer.

    python3 benchmarks/torch_op_choices.py --out $OUT/torch_op_choices.json
"""

# Each case's lambdas are timed inside the loop iteration that makes them, so late binding is safe.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import collections
import datetime as _dt
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from triton_kernels import Timer, _environment, write_json_atomically  # noqa: E402

aten = torch.ops.aten


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))


def _time_ways(timer: Timer, ways: dict[str, Callable[[], torch.Tensor]]) -> dict[str, Any]:
    reference = None
    out: dict[str, Any] = {}
    for name, fn in ways.items():
        value = fn()
        reference = value if reference is None else reference
        timing = timer(fn)
        out[name] = {"graph_ms": (timing.get("graph") or {}).get("median_ms"), "eager_ms": timing["eager"]["median_ms"],
                     "rel_err": _rel(value, reference)}
    return out


def lm_head_cases(timer: Timer, device: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    rows = []
    for m, k, n in ((512, 768, 50257), (1024, 768, 30522), (512, 768, 50264)):
        x = torch.randn(m, k, device=device, dtype=dtype)
        w = torch.randn(n, k, device=device, dtype=dtype) * 0.02
        padded_n = -(-n // 8) * 8
        wp = torch.zeros(padded_n, k, device=device, dtype=dtype)
        wp[:n] = w
        ways = {
            "as is": lambda: F.linear(x, w),
            "padded, sliced view": lambda: F.linear(x, wp)[:, :n],
            "padded, sliced copy": lambda: F.linear(x, wp)[:, :n].contiguous(),
        }
        rows.append({"case": f"lm_head {m}x{k}x{n}", "ways": _time_ways(timer, ways)})
    return rows


def qkv_cases(timer: Timer, device: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    rows = []
    for label, m in (("BERT b8 s128", 1024), ("ViT b8", 8 * 197), ("GPT-2-size b1 s512", 512)):
        k = 768
        x = torch.randn(m, k, device=device, dtype=dtype)
        ws = [torch.randn(k, k, device=device, dtype=dtype) * 0.02 for _ in range(3)]
        bs = [torch.randn(k, device=device, dtype=dtype) * 0.02 for _ in range(3)]
        packed_w = torch.cat([w.t() for w in ws], 1).t().contiguous()  # [3k, k] as nn.Linear stores it
        packed_b = torch.cat(bs)

        def separate() -> torch.Tensor:
            return torch.cat([F.linear(x, w, b) for w, b in zip(ws, bs)], 1)

        def separate_only() -> Any:
            return [F.linear(x, w, b) for w, b in zip(ws, bs)][0]

        def packed() -> torch.Tensor:
            return F.linear(x, packed_w, packed_b)

        ways = {"three GEMMs (+cat to compare)": separate, "packed GEMM": packed}
        result = _time_ways(timer, ways)
        result["three GEMMs"] = {"graph_ms": (timer(separate_only).get("graph") or {}).get("median_ms")}
        rows.append({"case": f"qkv {label} {m}x{k}x3*{k}", "ways": result})
    return rows


def epilogue_cases(timer: Timer, device: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    rows = []
    for m, k, n in ((512, 768, 3072), (1024, 768, 3072), (1576, 768, 3072)):
        x = torch.randn(m, k, device=device, dtype=dtype)
        w = torch.randn(k, n, device=device, dtype=dtype) * 0.02
        b = torch.randn(n, device=device, dtype=dtype) * 0.02
        wt = w.t().contiguous().t()  # column-major, as nn.Linear's weight.t()
        for act in ("gelu_tanh", "relu"):
            gelu = act == "gelu_tanh"
            ways = {
                "addmm + activation": (lambda: F.gelu(torch.addmm(b, x, wt), approximate="tanh")) if gelu
                else (lambda: torch.relu(torch.addmm(b, x, wt))),
                "cuBLASLt epilogue": lambda: aten._addmm_activation(b, x, wt, use_gelu=gelu),
            }
            rows.append({"case": f"epilogue {act} {m}x{k}x{n}", "ways": _time_ways(timer, ways)})
    return rows


def resnet_convs(device: torch.device, dtype: torch.dtype) -> list[tuple[tuple[Any, ...], int]]:
    """(conv shape key, count) for every conv of torchvision's ResNet-50 at b32 224px."""
    import torchvision

    model = torchvision.models.resnet50(weights=None).eval().to(device, dtype).to(memory_format=torch.channels_last)
    seen: collections.Counter[tuple[Any, ...]] = collections.Counter()
    residual_convs = set()
    for module in model.modules():
        if isinstance(module, torchvision.models.resnet.Bottleneck):
            residual_convs.add(id(module.conv3))  # conv3 -> bn3 -> += identity -> relu

    def hook(module: torch.nn.Conv2d, args: Any, output: Any) -> None:
        x = args[0]
        relu = id(module) in residual_convs or not _is_downsample(module)
        key = (tuple(x.shape), tuple(module.weight.shape), module.stride, module.padding, module.groups,
               "add_relu" if id(module) in residual_convs else ("relu" if relu else "none"))
        seen[key] += 1

    def _is_downsample(module: torch.nn.Conv2d) -> bool:
        return module.kernel_size == (1, 1) and module in downsample_convs

    downsample_convs = [m[0] for name, m in model.named_modules() if name.endswith("downsample")]
    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        model(torch.randn(32, 3, 224, 224, device=device, dtype=dtype).to(memory_format=torch.channels_last))
    for h in handles:
        h.remove()
    return list(seen.items())


def conv_cases(timer: Timer, device: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    pointwise_relu = torch.compile(lambda y, b: torch.relu(y + b.view(1, -1, 1, 1)), dynamic=True)
    pointwise_add_relu = torch.compile(lambda y, b, z: torch.relu(y + b.view(1, -1, 1, 1) + z), dynamic=True)
    pointwise_bias = torch.compile(lambda y, b: y + b.view(1, -1, 1, 1), dynamic=True)
    rows = []
    for (xs, ws, stride, padding, groups, epilogue), count in resnet_convs(device, dtype):
        x = torch.randn(xs, device=device, dtype=dtype).to(memory_format=torch.channels_last)
        w = (torch.randn(ws, device=device, dtype=dtype) * 0.05).to(memory_format=torch.channels_last)
        b = torch.randn(ws[0], device=device, dtype=dtype) * 0.05
        out_shape = F.conv2d(x, w, None, stride, padding).shape
        z = torch.randn(out_shape, device=device, dtype=dtype).to(memory_format=torch.channels_last)
        conv = lambda: F.conv2d(x, w, None, stride, padding, 1, groups)  # noqa: E731
        if epilogue == "add_relu":
            ways = {
                "conv + fused pointwise": lambda: pointwise_add_relu(conv(), b, z),
                "conv(bias) + add + relu": lambda: torch.relu(F.conv2d(x, w, b, stride, padding, 1, groups) + z),
                "cudnn_convolution_add_relu": lambda: aten.cudnn_convolution_add_relu(x, w, z, 1.0, b, list(stride), list(padding), [1, 1], groups),
            }
        elif epilogue == "relu":
            ways = {
                "conv + fused pointwise": lambda: pointwise_relu(conv(), b),
                "conv(bias) + relu": lambda: torch.relu(F.conv2d(x, w, b, stride, padding, 1, groups)),
                "cudnn_convolution_relu": lambda: aten.cudnn_convolution_relu(x, w, b, list(stride), list(padding), [1, 1], groups),
            }
        else:
            ways = {
                "conv + fused pointwise": lambda: pointwise_bias(conv(), b),
                "conv(bias)": lambda: F.conv2d(x, w, b, stride, padding, 1, groups),
            }
        rows.append({"case": f"conv x{list(xs)} w{list(ws)} s{stride[0]} {epilogue}", "count": count, "ways": _time_ways(timer, ways)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--cases", default="lm_head,qkv,epilogue,conv")
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.float16
    timer = Timer(device, warmup=10, iters=args.iters)
    families = {"lm_head": lm_head_cases, "qkv": qkv_cases, "epilogue": epilogue_cases, "conv": conv_cases}
    rows: list[dict[str, Any]] = []
    for family in args.cases.split(","):
        try:
            rows += families[family](timer, device, dtype)
        except Exception as error:  # one family failing must not lose the others
            rows.append({"case": family, "error": f"{type(error).__name__}: {error}"})
    totals: dict[str, float] = collections.defaultdict(float)
    for row in rows:
        if row.get("count"):
            for way, t in row["ways"].items():
                if t.get("graph_ms") is not None:
                    totals[way] += t["graph_ms"] * row["count"]
    data = {"benchmark": "torch_op_choices", "date": _dt.date.today().isoformat(), "environment": _environment(device),
            "rows": rows, "resnet50_conv_totals_ms": dict(totals)}
    if args.out:
        write_json_atomically(data, args.out)
    for row in rows:
        if "error" in row:
            print(f"{row['case']}: {row['error']}")
            continue
        cells = "  ".join(f"{way}: {t.get('graph_ms') or float('nan'):.4f}" + (f" (err {t['rel_err']:.1e})" if "rel_err" in t else "")
                          for way, t in row["ways"].items())
        print(f"{row['case']}{' x' + str(row['count']) if row.get('count') else ''}: {cells}")
    print("ResNet-50 conv totals (ms, GPU):", {k: round(v, 4) for k, v in totals.items()})


if __name__ == "__main__":
    main()
