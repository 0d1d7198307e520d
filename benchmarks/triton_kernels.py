"""graphopt's Triton kernels (torch.ops.graphopt.*) against the torch ops they replace.

    python benchmarks/triton_kernels.py --out OUT.json                   # CUDA: every case
    python benchmarks/triton_kernels.py --only attention,rms_norm --out OUT.json
    python benchmarks/triton_kernels.py --dry-run --out /tmp/tk.json     # CPU, tiny sizes, reference path
    TRITON_INTERPRET=1 python benchmarks/triton_kernels.py --dry-run --out /tmp/tk.json   # CPU, Triton interpreter

Cases (fp16, attention in bf16 too):

  attention   BERT-base b8 s128 12 heads d64 (with and without a padding mask), GPT-2 b1 s512 12
              heads d64 causal, LLaMA-like b1 s512 32 query / 8 key-value heads d128 causal.
              torch: F.scaled_dot_product_attention (enable_gqa for GQA) and, for GQA, SDPA on
              key/value heads repeated beforehand (not timed): the best torch can do.
  linear_act  x [1024, 768] @ w [768, 3072] + bias, then none/relu/gelu/gelu_tanh/silu.
              torch: F.linear (nn.Linear's [N, K] weight) then the activation.
  layer_norm  [4096, 768] and [4096, 4096], with a residual add (torch: add, then
              F.layer_norm) and without (torch: F.layer_norm).
  rms_norm    the same sizes; torch: add, then F.rms_norm.
  swiglu      LLaMA-7B MLP gate/up [2048, 11008], separate and as halves of one [2048, 22016]
              projection; geglu [4096, 3072] (erf and tanh). torch: F.silu(g) * u, F.gelu(g) * u.
  rotary      LLaMA q [1, 32, 512, 128], cos/sin [1, 512, 128]; torch: transformers'
              apply_rotary_pos_emb formula (x * cos + rotate_half(x) * sin).

Timing (CUDA): --warmup calls (which include Triton's autotuning), then --iters timed calls,
each between two CUDA events with a 256 MiB buffer written before it so that no input is
still in L2; median, p10 and p90 in ms. CPU (--dry-run): time.perf_counter around each call.

Numerics, in the same run: the graphopt op's output against the torch op's (max |diff| /
max |ref|), and both against torch's op on fp32 copies of the inputs (which of the two is
closer to exact). A case whose graphopt output is further than the tolerance from torch's
is marked FAIL and the script exits 1 (after writing everything).

Output: the full results as JSON (--out, written atomically) and a table printed last.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import graphopt.kernels  # noqa: E402,F401  (registers torch.ops.graphopt.*)
from graphopt.kernels import _triton  # noqa: E402
from graphopt.kernels.attention import attention_triton  # noqa: E402
from graphopt.kernels.gates import geglu_triton, swiglu_triton  # noqa: E402
from graphopt.kernels.matmul import linear_act_triton  # noqa: E402
from graphopt.kernels.norms import layer_norm_triton, rms_norm_triton  # noqa: E402
from graphopt.kernels.rotary import rotary_triton  # noqa: E402

ops = torch.ops.graphopt
#: graphopt vs torch, max |diff| / max |ref|, by output dtype
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 3e-2, torch.float32: 1e-4}
L2_FLUSH_BYTES = 256 * 1024 * 1024

Inputs = dict[str, Any]


@dataclass
class Case:
    name: str  # unique, e.g. "attention/llama-gqa-s512/fp16"
    kernel: str  # the family, for --only
    shape: str  # for the table
    dtype: torch.dtype
    make: Callable[[torch.device, torch.dtype, bool], Inputs]  # (device, dtype, tiny) -> inputs
    graphopt: Callable[[Inputs], Any]  # the op as users call it
    launcher: Callable[[Inputs], Any]  # the Triton launcher itself (interpreter runs)
    torch_variants: dict[str, Callable[[Inputs], Any]]  # name -> the torch ops it replaces
    uses_dot: bool = False  # the interpreter's bf16 tl.dot is wrong: such cases skip bf16 there
    notes: list[str] = field(default_factory=list)


# =========================================================================== inputs


def _randn(device: torch.device, dtype: torch.dtype, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype)


def _attention_inputs(batch: int, heads: int, kv_heads: int, seq: int, dim: int, causal: bool, padding: bool) -> Callable[..., Inputs]:
    def make(device: torch.device, dtype: torch.dtype, tiny: bool) -> Inputs:
        b, h, hkv, s, d = (1, 4, max(1, 4 * kv_heads // heads), 24, 16) if tiny else (batch, heads, kv_heads, seq, dim)
        inputs: Inputs = {
            "q": _randn(device, dtype, b, h, s, d), "k": _randn(device, dtype, b, hkv, s, d), "v": _randn(device, dtype, b, hkv, s, d),
            "mask": None, "causal": causal,
        }
        if padding:  # BERT-style: batch i has its last (i * 7) % s keys padded, masked with finfo.min
            mask = torch.zeros(b, 1, 1, s, device=device, dtype=dtype)
            for i in range(b):
                pad = (i * 7) % s
                if pad:
                    mask[i, ..., s - pad :] = torch.finfo(dtype).min
            inputs["mask"] = mask
        return inputs

    return make


def _sdpa(i: Inputs) -> torch.Tensor:
    gqa = i["q"].shape[1] != i["k"].shape[1]
    return F.scaled_dot_product_attention(i["q"], i["k"], i["v"], attn_mask=i["mask"], is_causal=i["causal"], enable_gqa=gqa)


def _sdpa_repeated_kv(i: Inputs) -> torch.Tensor:
    if "k_rep" not in i:  # built once, outside the timed calls
        group = i["q"].shape[1] // i["k"].shape[1]
        i["k_rep"], i["v_rep"] = i["k"].repeat_interleave(group, 1), i["v"].repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(i["q"], i["k_rep"], i["v_rep"], attn_mask=i["mask"], is_causal=i["causal"])


def _linear_inputs(m: int, k: int, n: int) -> Callable[..., Inputs]:
    def make(device: torch.device, dtype: torch.dtype, tiny: bool) -> Inputs:
        mm, kk, nn_ = (40, 24, 48) if tiny else (m, k, n)
        weight = _randn(device, dtype, nn_, kk, scale=kk**-0.5)  # nn.Linear's [N, K]
        return {"x": _randn(device, dtype, mm, kk), "weight": weight, "bias": _randn(device, dtype, nn_)}

    return make


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda y: y, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"), "silu": F.silu,
}


def _norm_inputs(rows: int, n: int, residual: bool) -> Callable[..., Inputs]:
    def make(device: torch.device, dtype: torch.dtype, tiny: bool) -> Inputs:
        r, nn_ = (12, 48) if tiny else (rows, n)
        return {
            "x": _randn(device, dtype, r, nn_), "residual": _randn(device, dtype, r, nn_) if residual else None,
            "weight": _randn(device, dtype, nn_), "bias": _randn(device, dtype, nn_),
        }

    return make


def _torch_layer_norm(i: Inputs) -> torch.Tensor:
    s = i["x"] + i["residual"] if i["residual"] is not None else i["x"]
    return F.layer_norm(s, (s.shape[-1],), i["weight"], i["bias"], 1e-5)


def _torch_rms_norm(i: Inputs) -> torch.Tensor:
    s = i["x"] + i["residual"] if i["residual"] is not None else i["x"]
    return F.rms_norm(s, (s.shape[-1],), i["weight"], 1e-6)


def _gate_inputs(rows: int, n: int, chunked: bool) -> Callable[..., Inputs]:
    def make(device: torch.device, dtype: torch.dtype, tiny: bool) -> Inputs:
        r, nn_ = (6, 1100) if tiny else (rows, n)
        if chunked:  # the two halves of one projection's output: strided views, not copies
            gate, up = _randn(device, dtype, r, 2 * nn_).chunk(2, -1)
        else:
            gate, up = _randn(device, dtype, r, nn_), _randn(device, dtype, r, nn_)
        return {"gate": gate, "up": up}

    return make


def _rotary_inputs(batch: int, heads: int, seq: int, dim: int) -> Callable[..., Inputs]:
    def make(device: torch.device, dtype: torch.dtype, tiny: bool) -> Inputs:
        b, h, s, d = (1, 4, 12, 32) if tiny else (batch, heads, seq, dim)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device).float() / d))
        freqs = torch.arange(s, device=device).float()[:, None] * inv_freq
        emb = torch.cat((freqs, freqs), -1)[None]
        return {"x": _randn(device, dtype, b, h, s, d), "cos": emb.cos().to(dtype), "sin": emb.sin().to(dtype)}

    return make


def _hf_rotary(i: Inputs) -> torch.Tensor:
    x, cos, sin = i["x"], i["cos"].unsqueeze(1), i["sin"].unsqueeze(1)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


# =========================================================================== cases


def build_cases() -> list[Case]:
    cases: list[Case] = []
    attention = [
        ("bert-b8-s128", 8, 12, 12, 128, 64, False, False),
        ("bert-b8-s128-padmask", 8, 12, 12, 128, 64, False, True),
        ("gpt2-b1-s512-causal", 1, 12, 12, 512, 64, True, False),
        ("llama-gqa32/8-b1-s512-d128-causal", 1, 32, 8, 512, 128, True, False),
    ]
    for label, b, h, hkv, s, d, causal, padding in attention:
        for dtype in (torch.float16, torch.bfloat16):
            variants = {"sdpa": _sdpa}
            if hkv != h:
                variants["sdpa_repeated_kv"] = _sdpa_repeated_kv
            cases.append(Case(
                f"attention/{label}/{_dt_name(dtype)}", "attention", f"q[{b},{h},{s},{d}] kv heads {hkv}", dtype,
                _attention_inputs(b, h, hkv, s, d, causal, padding),
                lambda i: ops.attention(i["q"], i["k"], i["v"], i["mask"], i["causal"]),
                lambda i: attention_triton(i["q"], i["k"], i["v"], i["mask"], i["causal"]),
                variants, uses_dot=True,
            ))
    for act, torch_act in _ACTIVATIONS.items():
        cases.append(Case(
            f"linear_act/1024x768x3072/{act}/fp16", "linear_act", "[1024,768]@[768,3072]", torch.float16, _linear_inputs(1024, 768, 3072),
            lambda i, a=act: ops.linear_act(i["x"], i["weight"].t(), i["bias"], a),
            lambda i, a=act: linear_act_triton(i["x"], i["weight"].t(), i["bias"], a),
            {f"linear+{act}": lambda i, f=torch_act: f(F.linear(i["x"], i["weight"], i["bias"]))}, uses_dot=True,
        ))
    for rows, n in ((4096, 768), (4096, 4096)):
        for residual in (True, False):
            tag = "+residual" if residual else ""
            cases.append(Case(
                f"layer_norm/{rows}x{n}{tag}/fp16", "layer_norm", f"[{rows},{n}]", torch.float16, _norm_inputs(rows, n, residual),
                lambda i: ops.layer_norm(i["x"], i["residual"], i["weight"], i["bias"], 1e-5)[0],
                lambda i: layer_norm_triton(i["x"], i["residual"], i["weight"], i["bias"], 1e-5)[0],
                {("add+" if residual else "") + "F.layer_norm": _torch_layer_norm},
            ))
        cases.append(Case(
            f"rms_norm/{rows}x{n}+residual/fp16", "rms_norm", f"[{rows},{n}]", torch.float16, _norm_inputs(rows, n, True),
            lambda i: ops.rms_norm(i["x"], i["residual"], i["weight"], 1e-6)[0],
            lambda i: rms_norm_triton(i["x"], i["residual"], i["weight"], 1e-6)[0],
            {"add+F.rms_norm": _torch_rms_norm},
        ))
    for chunked in (False, True):
        tag = "-chunked" if chunked else ""
        cases.append(Case(
            f"swiglu/2048x11008{tag}/fp16", "swiglu", "[2048,11008]", torch.float16, _gate_inputs(2048, 11008, chunked),
            lambda i: ops.swiglu(i["gate"], i["up"]), lambda i: swiglu_triton(i["gate"], i["up"]),
            {"silu*up": lambda i: F.silu(i["gate"]) * i["up"]},
        ))
    for approximate in (False, True):
        tag = "-tanh" if approximate else ""
        cases.append(Case(
            f"geglu/4096x3072{tag}/fp16", "geglu", "[4096,3072]", torch.float16, _gate_inputs(4096, 3072, False),
            lambda i, a=approximate: ops.geglu(i["gate"], i["up"], a), lambda i, a=approximate: geglu_triton(i["gate"], i["up"], a),
            {"gelu*up": lambda i, a=approximate: F.gelu(i["gate"], approximate="tanh" if a else "none") * i["up"]},
        ))
    cases.append(Case(
        "rotary/llama-q-1x32x512x128/fp16", "rotary", "[1,32,512,128]", torch.float16, _rotary_inputs(1, 32, 512, 128),
        lambda i: ops.rotary(i["x"], i["cos"], i["sin"]), lambda i: rotary_triton(i["x"], i["cos"], i["sin"]),
        {"hf_apply_rotary": _hf_rotary},
    ))
    return cases


def _dt_name(dtype: torch.dtype) -> str:
    return {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]


# =========================================================================== timing and numerics


class Timer:
    """Medians of timed calls. On CUDA, two ways: eager (each call launched from Python, so
    dispatch and launch overhead count when they exceed the kernel's time) and graph (the
    call captured once in a CUDA graph and replayed: the GPU's time alone, as under
    torch.compile with CUDA graphs)."""

    def __init__(self, device: torch.device, warmup: int, iters: int) -> None:
        self.device, self.warmup, self.iters = device, warmup, iters
        self.flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device) if device.type == "cuda" else None

    def __call__(self, fn: Callable[[], Any]) -> dict[str, Any]:
        for _ in range(self.warmup):  # includes Triton's autotuning on the first call
            fn()
        result: dict[str, Any] = {"eager": self._cuda_events(fn) if self.device.type == "cuda" else self._wall(fn)}
        if self.device.type == "cuda":
            try:
                graph = self._capture(fn)
                result["graph"] = self._cuda_events(graph.replay)
            except Exception as e:  # a call that cannot be captured still has its eager time
                result["graph"] = None
                result["graph_error"] = f"{type(e).__name__}: {e}"
        return result

    def _capture(self, fn: Callable[[], Any]) -> torch.cuda.CUDAGraph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
        return graph

    def _cuda_events(self, fn: Callable[[], Any]) -> dict[str, float]:
        assert self.flush is not None
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        for start, end in zip(starts, ends):
            self.flush.zero_()  # evict the inputs from L2 (outside the timed window)
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return _stats([s.elapsed_time(e) for s, e in zip(starts, ends)])

    def _wall(self, fn: Callable[[], Any]) -> dict[str, float]:
        times = []
        for _ in range(self.iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return _stats(times)


def _stats(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {
        "median_ms": statistics.median(times),
        "p10_ms": times[int(0.1 * (len(times) - 1))],
        "p90_ms": times[int(0.9 * (len(times) - 1))],
        "runs": len(times),
    }


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float(), want.float()
    if got.shape != want.shape:
        return math.inf
    scale = want.abs().max().item() or 1.0
    diff = (got - want).abs().max().item()
    return diff / scale if math.isfinite(diff) else math.inf


def _fp32_copy(inputs: Inputs) -> Inputs:
    return {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items() if not k.endswith("_rep")}


def _best_config(case: Case) -> str | None:
    """The autotuner's choice for the case's kernel, where there is one."""
    from graphopt.kernels import attention as attention_module
    from graphopt.kernels import matmul as matmul_module

    kernels = {"attention": [attention_module._attention_fwd_tuned, attention_module._attention_fwd_wide_rows], "linear_act": [matmul_module._linear_act_kernel]}
    chosen = [str(getattr(k, "best_config", None)) for k in kernels.get(case.kernel, []) if getattr(k, "best_config", None) is not None]
    return "; ".join(chosen) or None


def run_case(case: Case, device: torch.device, timer: Timer, use_launcher: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    inputs = case.make(device, case.dtype, device.type != "cuda")
    impl = case.launcher if use_launcher else case.graphopt
    result: dict[str, Any] = {"name": case.name, "kernel": case.kernel, "shape": case.shape, "dtype": _dt_name(case.dtype)}
    if device.type == "cuda":
        probe = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
        result["triton_path"] = _triton.use_triton(*probe)

    out = impl(inputs)
    torch_outs = {name: fn(inputs) for name, fn in case.torch_variants.items()}
    exact = next(iter(case.torch_variants.values()))(_fp32_copy(inputs))
    primary = next(iter(torch_outs.values()))
    result["numerics"] = {
        "rel_err_vs_torch": _rel_err(out, primary),
        "graphopt_rel_err_vs_fp32": _rel_err(out, exact),
        "torch_rel_err_vs_fp32": {name: _rel_err(o, exact) for name, o in torch_outs.items()},
        "tolerance": TOLERANCE[case.dtype],
    }
    result["ok"] = result["numerics"]["rel_err_vs_torch"] <= TOLERANCE[case.dtype]

    result["graphopt"] = timer(lambda: impl(inputs))
    result["torch"] = {name: timer(lambda fn=fn: fn(inputs)) for name, fn in case.torch_variants.items()}
    for mode in ("eager", "graph"):
        if result["graphopt"].get(mode) is None:
            continue
        timed = {n: t[mode]["median_ms"] for n, t in result["torch"].items() if t.get(mode) is not None}
        if timed:
            best = min(timed, key=lambda n: timed[n])
            result[f"torch_best_{mode}"] = best
            result[f"speedup_{mode}"] = timed[best] / result["graphopt"][mode]["median_ms"]
    result["best_config"] = _best_config(case) if device.type == "cuda" or use_launcher else None
    return result


# =========================================================================== output


def _environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(), "torch": torch.__version__, "device": str(device),
        "triton": None, "triton_interpret": _triton.INTERPRET, "host": platform.node(),
    }
    if _triton.HAS_TRITON:
        import triton

        env["triton"] = triton.__version__
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        env["allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
    return env


def write_json_atomically(data: Any, path: Path) -> None:
    text = json.dumps(data, indent=2, default=str)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staged = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(staged, path)
    except BaseException:
        Path(staged).unlink(missing_ok=True)
        raise


def print_table(results: list[dict[str, Any]]) -> None:
    """One line per case. ms: medians; graph = CUDA-graph replay (GPU time), eager = launched
    from Python; speedup = the best torch variant's median / graphopt's (> 1: graphopt faster)."""

    def ms(r: dict[str, Any], who: str, mode: str) -> str:
        if who == "torch":
            best = r.get(f"torch_best_{mode}")
            timing = r["torch"][best].get(mode) if best else None
        else:
            timing = r["graphopt"].get(mode)
        return f"{timing['median_ms']:.4f}" if timing else "-"

    def speedup(r: dict[str, Any], mode: str) -> str:
        return f"{r[f'speedup_{mode}']:.2f}x" if f"speedup_{mode}" in r else "-"

    header = (f"{'case':<50} {'go graph':>9} {'torch graph':>11} {'speedup':>7} {'go eager':>9} {'torch eager':>11} {'speedup':>7} "
              f"{'torch op':<17} {'rel err':>8}  ok")
    print()
    print(header)
    print("-" * len(header))
    for r in results:
        if "error" in r:
            print(f"{r['name']:<50} ERROR: {r['error'][:200]}")
            continue
        if "skipped" in r:
            print(f"{r['name']:<50} skipped: {r['skipped']}")
            continue
        best = r.get("torch_best_graph") or r.get("torch_best_eager", "")
        print(
            f"{r['name']:<50} {ms(r, 'graphopt', 'graph'):>9} {ms(r, 'torch', 'graph'):>11} {speedup(r, 'graph'):>7} "
            f"{ms(r, 'graphopt', 'eager'):>9} {ms(r, 'torch', 'eager'):>11} {speedup(r, 'eager'):>7} "
            f"{best:<17} {r['numerics']['rel_err_vs_torch']:>8.1e}  {'ok' if r['ok'] else 'FAIL'}"
        )
    print("ms: medians; graph: CUDA-graph replay (GPU time); eager: launched from Python; speedup: best torch / graphopt")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", type=Path, required=True, help="where to write the JSON results")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: the reference path (or the interpreter with TRITON_INTERPRET=1)")
    ap.add_argument("--only", default="", help="comma-separated kernel families or case-name substrings")
    ap.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 25; dry run 1)")
    ap.add_argument("--iters", type=int, default=None, help="timed calls (default 100, at least 50 on CUDA; dry run 3)")
    args = ap.parse_args(argv)

    if args.dry_run:
        device = torch.device("cpu")
        warmup, iters = args.warmup if args.warmup is not None else 1, args.iters if args.iters is not None else 3
    else:
        if not torch.cuda.is_available():
            print("error: no CUDA device; use --dry-run on CPU", file=sys.stderr)
            return 2
        if not _triton.HAS_TRITON:
            print("error: triton is not installed: the CUDA run would time the reference path", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        warmup, iters = args.warmup if args.warmup is not None else 25, args.iters if args.iters is not None else 100
        if iters < 50:
            print("error: --iters must be at least 50 on CUDA (medians of >= 50 runs)", file=sys.stderr)
            return 2
    use_launcher = device.type == "cpu" and _triton.INTERPRET
    cases = build_cases()
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        cases = [c for c in cases if c.kernel in wanted or any(w in c.name for w in wanted)]
        if not cases:
            print(f"error: --only {args.only!r} matches no case", file=sys.stderr)
            return 2

    timer = Timer(device, warmup, iters)
    results: list[dict[str, Any]] = []
    for case in cases:
        if use_launcher and case.uses_dot and case.dtype == torch.bfloat16:
            results.append({"name": case.name, "kernel": case.kernel, "skipped": "the Triton interpreter's bf16 tl.dot is wrong"})
            continue
        print(f"{case.name} ...", file=sys.stderr, flush=True)
        try:
            results.append(run_case(case, device, timer, use_launcher))
        except Exception as e:  # one broken case must not hide the others' numbers
            results.append({"name": case.name, "kernel": case.kernel, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        if device.type == "cuda":
            torch.cuda.empty_cache()

    data = {
        "environment": _environment(device),
        "settings": {"warmup": warmup, "iters": iters, "dry_run": args.dry_run, "path": "triton launcher" if use_launcher else "torch.ops.graphopt"},
        "results": results,
    }
    write_json_atomically(data, args.out)
    print_table(results)
    print(f"\nwrote {args.out}")
    failed = [r["name"] for r in results if "error" in r or ("ok" in r and not r["ok"])]
    if failed:
        print(f"{len(failed)} case(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
