"""The options of `torch.compile(model, backend="graphopt", options={...}, mode=...)`, parsed and checked.

`TorchOptions.parse` turns torch.compile's `options` dict and `mode` into one typed
object, raising GraphoptError for an unknown option or a bad value (docs/torch-compile.md
says what each option means); `kernel_policy` says which graphopt custom kernels the
lowering may use under that mode. Nothing here imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from graphopt.errors import GraphoptError

__all__ = ["TorchOptions"]

_LAYOUTS = ("auto", "nhwc", "nchw")
_PRECISIONS = (None, "fp8")
_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_WEIGHTS = (None, "int8", "int4")
_BLOCK_SIZES = (32, 64, 128)
_CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the modes in which inductor replays CUDA graphs
_ATTENTION_MASKS = ("keep", "aligned", "copy", "decompose")  # graphopt/passes/fx_sdpa.py (kept in step with MASK_HANDLING)


@dataclass
class TorchOptions:
    """What ``torch.compile(..., options={...})`` may set (see docs/torch-compile.md)."""

    #: Only these rules (None: the whole library). ``"rules"`` is accepted as another name.
    enable: list[str] | None = None
    disable: list[str] = field(default_factory=list)
    #: Extra .pdll / .py pattern files or folders, loaded after the built-in library.
    patterns: list[str] = field(default_factory=list)
    #: Write each graph's report here, as JSON or (for a .html name) as the HTML page; an
    #: index is added per graph, or put {index} in the name.
    report: str | None = None
    #: Hand the rewritten graph to inductor (True) or run it as it is (False).
    inductor: bool = True
    #: Inference only: parameters and buffers become constants (they must not change after compiling).
    freeze: bool = True
    #: "auto" (channels-last convolutions on CUDA), "nhwc" (always), "nchw" (never).
    layout: str = "auto"
    fold_size_limit: int = 1 << 20
    max_sweeps: int = 8
    #: Keep every failed attempt in report.trace.
    trace: bool = False
    #: Raise when graphopt fails on a graph (default: warn, and run the graph without its rewrites).
    strict: bool = False
    #: Which torch.ops.graphopt custom kernels fused ops may run on: "all", "none" (ATen ops
    #: only), or "auto": all without inductor; with inductor and CUDA graphs only those measured
    #: faster than inductor's own code (torch_lowering.PREFERRED_OVER_INDUCTOR), so it is never
    #: slower; with inductor and no CUDA graphs none: a custom op's Python dispatch, which CUDA
    #: graphs do away with, costs more than its kernel saves (ResNet-50 on an H200: 3.64 ms
    #: with cuDNN's fused conv as a custom op, against inductor's 2.02 ms).
    kernels: str = "auto"
    #: With inductor: compile the graph both ways (graphopt's rewrites, and as dynamo captured
    #: it), time both on the example inputs, and keep the faster (the report says which, and
    #: the times). Costs a second compile; graphs graphopt leaves unchanged skip it.
    tune: bool = False
    #: "fp8": GEMMs with a constant weight run in FP8 E4M3 (torch._scaled_mm, per-row scales;
    #: CUDA compute capability >= 8.9, needs freeze; graphopt/passes/fx_fp8.py). None: as the model is.
    precision: str | None = None
    #: With precision "fp8": GEMMs kept in the model's type, by fnmatch pattern on the weight's
    #: parameter name ("*.lm_head.*"); None: the lm head (the default), []: none kept.
    precision_keep: list[str] | None = None
    #: torch.compile's mode (passed to inductor; "reduce-overhead" also means CUDA graphs without it).
    #: torch.compile takes mode= or options=, not both: options={"mode": ...} sets it along with others.
    mode: str | None = None
    #: Weight-only quantization of the matmuls with constant weights (needs freeze): None, "int8"
    #: or "int4" (graphopt/passes/fx_weight_quant.py), per block of `block_size` input rows.
    weights: str | None = None
    block_size: int = 32
    #: Module-name / op globs left in full precision; None: the default block list (lm head, embeddings).
    weights_keep: list[str] | None = None
    #: Per-layer accuracy budget in dB (SNR of x @ W against x @ dequant(W)); None: 35 for int8, 20 for int4.
    weights_min_snr: float | None = None
    #: What an SDPA mask a fused CUDA attention kernel would not read becomes (graphopt/passes/fx_sdpa.py):
    #: "keep" (as folding left it), "aligned" (a fresh aligned constant in the query's dtype),
    #: "copy" (copied dense on every call), "decompose" (that attention written out as matmul + softmax).
    attention_mask: str = "keep"
    #: Where inductor autotunes (max-autotune): graphopt's GEMM kernels (linear + activation, wq_linear) timed against
    #: inductor's own code per site, kept only where they win (graphopt/inductor_sites.py, inductor_choices.py). Off by
    #: default: on an H100 (benchmarks/RESULTS.md, 2026-11-28) graphopt::linear_act lost every site (0.08-0.22x
    #: inductor's best GEMM), so the sites would only add their timing to the compile.
    autotune_kernels: bool = False
    #: With inductor replaying CUDA graphs (mode "reduce-overhead" / "max-autotune"): GEMMs of few rows (decode: M <= 16 when compiled) with a constant fp16/bf16 weight on
    #: CUDA are offered to inductor's autotuner as graphopt::gemv_linear (graphopt/passes/fx_gemv.py), timed there against
    #: inductor's own lowering of the same linear, kept only where faster. Off by default: it adds that timing to the
    #: compile, and its kernel's gain is not yet measured end to end (benchmarks/gemv_bench.py, llm_decode.py).
    gemv: bool = False

    def cuda_graphs(self) -> bool:
        """Whether the compiled graph replays as CUDA graphs (inductor's, or CudaGraphReplay without it)."""
        return self.mode in _CUDA_GRAPH_MODES if self.inductor else self.mode == "reduce-overhead"

    def kernel_policy(self) -> str:
        if self.kernels == "auto":
            if not self.inductor:
                return "all"
            return "inductor" if self.mode in _CUDA_GRAPH_MODES else "none"
        return self.kernels

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None, mode: str | None = None) -> TorchOptions:
        given = dict(options or {})
        if "rules" in given:
            if "enable" in given:
                raise GraphoptError("graphopt options: give 'rules' or 'enable', not both")
            given["enable"] = given.pop("rules")
        # torch.compile takes mode= or options=, never both: the mode may come in the options.
        if "mode" in given and mode is not None:
            raise GraphoptError("graphopt: mode given twice (torch.compile's mode= and options['mode'])")
        mode = given.pop("mode", mode)
        known = {f.name for f in fields(cls)} - {"mode"}
        unknown = sorted(set(given) - known)
        if unknown:
            raise GraphoptError(f"unknown graphopt option {', '.join(map(repr, unknown))} (known: rules, mode, {', '.join(sorted(known))})")
        opts = cls(mode=mode)
        for key, value in given.items():
            if key in ("enable", "disable", "patterns"):
                value = [value] if isinstance(value, (str, os.PathLike)) else value
                if value is not None and not all(isinstance(v, (str, os.PathLike)) for v in value):
                    raise GraphoptError(f"graphopt option '{key}' takes a list of names, not {value!r}")
                value = None if value is None else [str(v) for v in value]
            elif key == "precision_keep":
                value = [value] if isinstance(value, str) else value
                if value is not None and not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
                    raise GraphoptError(f"graphopt option 'precision_keep' takes a list of name patterns, not {value!r}")
                value = None if value is None else list(value)
            elif key == "precision" and value not in _PRECISIONS:
                raise GraphoptError(f"graphopt option 'precision' takes 'fp8' or None, not {value!r}")
            elif key in ("inductor", "freeze", "trace", "strict", "tune", "autotune_kernels", "gemv") and not isinstance(value, bool):
                raise GraphoptError(f"graphopt option '{key}' takes True or False, not {value!r}")
            elif key == "kernels" and value not in ("auto", "all", "none"):
                raise GraphoptError(f"graphopt option 'kernels' takes 'auto', 'all' or 'none', not {value!r}")
            elif key == "layout" and value not in _LAYOUTS:
                raise GraphoptError(f"graphopt option 'layout' takes one of {', '.join(_LAYOUTS)}, not {value!r}")
            elif key in ("fold_size_limit", "max_sweeps") and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise GraphoptError(f"graphopt option '{key}' takes a non-negative int, not {value!r}")
            elif key == "weights" and value not in _WEIGHTS:
                raise GraphoptError(f"graphopt option 'weights' takes 'int8' or 'int4' (or None), not {value!r}")
            elif key == "block_size" and (isinstance(value, bool) or value not in _BLOCK_SIZES):
                raise GraphoptError(f"graphopt option 'block_size' takes one of {', '.join(map(str, _BLOCK_SIZES))}, not {value!r}")
            elif key == "weights_keep":
                value = [value] if isinstance(value, str) else value
                if value is not None and (not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value)):
                    raise GraphoptError(f"graphopt option 'weights_keep' takes a list of name globs, not {value!r}")
                value = None if value is None else list(value)
            elif key == "weights_min_snr" and value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise GraphoptError(f"graphopt option 'weights_min_snr' takes a number of dB, not {value!r}")
            elif key == "attention_mask" and value not in _ATTENTION_MASKS:
                raise GraphoptError(f"graphopt option 'attention_mask' takes one of {', '.join(_ATTENTION_MASKS)}, not {value!r}")
            elif key == "report" and value is not None and not isinstance(value, (str, os.PathLike)):
                raise GraphoptError(f"graphopt option 'report' takes a path, not {value!r}")
            setattr(opts, key, str(value) if key == "report" and value is not None else value)
        if opts.weights is not None and not opts.freeze:
            raise GraphoptError("graphopt option 'weights' needs freeze=True: only constant weights can be quantized")
        if opts.precision == "fp8" and not opts.freeze:
            raise GraphoptError("graphopt option 'precision': 'fp8' needs freeze=True (the weights are quantized once, at compile time)")
        if opts.precision_keep is not None and opts.precision is None:
            raise GraphoptError("graphopt option 'precision_keep' only applies with precision='fp8'")
        if opts.weights is not None and opts.precision == "fp8":
            raise GraphoptError("graphopt options 'weights' and precision='fp8' are two ways to quantize the same GEMMs: give one")
        if opts.mode not in _MODES:
            raise GraphoptError(f"torch.compile mode {opts.mode!r} is not one of {', '.join(m for m in _MODES if m)}")
        return opts
