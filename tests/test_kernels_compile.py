"""Every Triton kernel compiles for an H100 (sm_90), without a GPU.

The interpreter (tests/test_kernels_triton.py) checks what the kernels compute but not
that Triton's compiler accepts them. Here each launcher runs with its launch captured
(torch.library.wrap_triton replaced by a recorder), and the captured kernel, arguments
and autotuning config go through triton.compile for a CUDA sm_90 target: Triton's own
front end, its GPU passes, LLVM and ptxas (bundled with the triton wheel). The shared
memory each config asks for must fit an H100's 227 KiB.

One config per variant keeps this quick: the first (the largest tiles, the most shared
memory), or for fp32 the last (fp32 without TF32 compiles to FMA loops, slow to build
with big tiles). The variants cover the kernels' constexpr branches.
"""

from collections.abc import Callable
from typing import Any

import pytest
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

from graphopt.kernels import _triton
from graphopt.kernels.attention import attention_triton
from graphopt.kernels.gates import geglu_triton, swiglu_triton
from graphopt.kernels.gemv import CONFIGS as GEMV_CONFIGS
from graphopt.kernels.gemv import gemv_linear_triton
from graphopt.kernels.matmul import linear_act_triton
from graphopt.kernels.norms import layer_norm_triton, rms_norm_triton
from graphopt.kernels.rotary import rotary_triton

H100 = GPUTarget("cuda", 90, 32)
H100_SHARED_BYTES = 227 * 1024
_TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.bool: "i1"}

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def _t(*shape: int, dtype: torch.dtype = F16) -> torch.Tensor:
    return torch.zeros(*shape, dtype=dtype)


VARIANTS: dict[str, Callable[[], Any]] = {
    "attention_fp16_causal_gqa_d128": lambda: attention_triton(_t(1, 8, 64, 128), _t(1, 2, 64, 128), _t(1, 2, 64, 128), None, True),
    "attention_bf16_bool_mask_causal_d64": lambda: attention_triton(
        _t(2, 4, 64, 64, dtype=BF16), _t(2, 4, 64, 64, dtype=BF16), _t(2, 4, 64, 64, dtype=BF16), torch.ones(64, 64, dtype=torch.bool), True
    ),
    "attention_fp32_additive_mask_d80_dv48": lambda: attention_triton(
        _t(1, 2, 33, 80, dtype=F32), _t(1, 2, 40, 80, dtype=F32), _t(1, 2, 40, 48, dtype=F32), _t(1, 1, 1, 40, dtype=F32)
    ),
    "linear_act_fp16_gelu_bias": lambda: linear_act_triton(_t(64, 768), _t(768, 3072), _t(3072), "gelu"),
    "linear_act_bf16_gelu_tanh_no_bias": lambda: linear_act_triton(_t(64, 768, dtype=BF16), _t(768, 512, dtype=BF16), None, "gelu_tanh"),
    "linear_act_fp32_silu": lambda: linear_act_triton(_t(64, 96, dtype=F32), _t(96, 64, dtype=F32), _t(64, dtype=F32), "silu"),
    "layer_norm_fp16_residual_bias": lambda: layer_norm_triton(_t(8, 768), _t(8, 768), _t(768, dtype=F32), _t(768, dtype=F32), 1e-5),
    "rms_norm_bf16_4096": lambda: rms_norm_triton(_t(8, 4096, dtype=BF16), None, _t(4096, dtype=BF16), 1e-6),
    "swiglu_fp16": lambda: swiglu_triton(_t(4, 1100), _t(4, 1100)),
    "geglu_bf16_both_forms": lambda: (geglu_triton(_t(4, 64, dtype=BF16), _t(4, 64, dtype=BF16)), geglu_triton(_t(4, 64, dtype=BF16), _t(4, 64, dtype=BF16), True)),
    # graphopt::gemv_linear: the sum path (3-D accumulator; a sum per K tile at 16 rows), the dot path, split-K's reduce
    "gemv_fp16_m1_bias": lambda: gemv_linear_triton(_t(1, 2048), _t(2560, 2048), _t(2560)),
    "gemv_bf16_m16_sum_per_tile": lambda: gemv_linear_triton(_t(16, 2048, dtype=BF16), _t(2048, 2048, dtype=BF16), None,
                                                             config=GEMV_CONFIGS["small"][3]),
    "gemv_bf16_m8_dot_split3_bias": lambda: gemv_linear_triton(_t(8, 2048, dtype=BF16), _t(64, 2048, dtype=BF16), _t(64, dtype=BF16),
                                                               split_k=3, config=GEMV_CONFIGS["small"][6]),
    "gemv_fp16_m40_dot": lambda: gemv_linear_triton(_t(40, 512), _t(256, 512), None),
    "rotary_fp16_both_forms": lambda: (
        rotary_triton(_t(1, 8, 16, 128), _t(1, 16, 128, dtype=F32), _t(1, 16, 128, dtype=F32)),
        rotary_triton(_t(1, 8, 16, 128), _t(1, 16, 64, dtype=F32), _t(1, 16, 64, dtype=F32), True),
    ),
}


class _Recorder:
    """Stands in for torch.library.wrap_triton: records ``kernel[grid](*args, **kwargs)``."""

    launches: list[tuple[Any, tuple, dict]] = []

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kwargs: self.launches.append((self.kernel, args, kwargs))


def _compile(kernel: Any, args: tuple, kwargs: dict, float_type: str = "fp32") -> Any:
    """triton.compile the launch for sm_90 (an autotuned kernel: with one of its configs).
    Python floats are typed `float_type`: "fp32" as Triton's launcher does, "fp64" as
    inductor does when it compiles the kernel inside a graph (torch.ops.graphopt under
    inductor: triton_utils.signature_of, `_use_fp64_for_unbacked_floats`)."""
    values = dict(kwargs)
    if isinstance(kernel, Autotuner):
        fp32 = any(isinstance(a, torch.Tensor) and a.dtype == torch.float32 for a in args[:2])
        config = kernel.configs[-1 if fp32 else 0]
        values.update(config.kwargs)
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        kernel = kernel.fn
    else:
        options = {"num_warps": values.pop("num_warps", 4), "num_stages": values.pop("num_stages", 3)}
    assert isinstance(kernel, JITFunction)
    values.update(zip(kernel.arg_names, args))
    signature, constants = {}, {}
    for param in kernel.params:
        value = values[param.name]
        if param.is_constexpr:
            signature[param.name], constants[param.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + _TRITON_TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[param.name] = float_type
        else:
            raise TypeError(f"{kernel.__name__}: argument {param.name} is a {type(value).__name__}")
    return triton.compile(ASTSource(kernel, signature, constants), target=H100, options=options)


def test_kernels_are_compiled_not_interpreted() -> None:
    assert _triton.HAS_TRITON and not _triton.INTERPRET


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_kernel_compiles_for_h100(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.library, "wrap_triton", _Recorder)
    monkeypatch.setattr(_Recorder, "launches", [])
    VARIANTS[variant]()
    assert _Recorder.launches, f"{variant} launched no Triton kernel"
    for kernel, args, kwargs in _Recorder.launches:
        compiled = _compile(kernel, args, kwargs)
        assert compiled.asm.get("cubin"), f"{variant}: no cubin"
        assert compiled.metadata.shared <= H100_SHARED_BYTES, f"{variant}: {compiled.metadata.shared} bytes of shared memory"


# The launches with Python float arguments (scales, epsilons).
_WITH_FLOATS = [
    "attention_fp16_causal_gqa_d128",
    "attention_bf16_bool_mask_causal_d64",
    "attention_fp32_additive_mask_d80_dv48",
    "layer_norm_fp16_residual_bias",
    "rms_norm_bf16_4096",
]


@pytest.mark.parametrize("variant", _WITH_FLOATS)
def test_kernel_compiles_as_inductor_types_it(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor passes Python floats as fp64: the kernels must keep their fp32 arithmetic
    (an fp64 scale once made the attention accumulator fp64, and tl.dot refused it)."""
    monkeypatch.setattr(torch.library, "wrap_triton", _Recorder)
    monkeypatch.setattr(_Recorder, "launches", [])
    VARIANTS[variant]()
    floats = [(kernel, args, kwargs) for kernel, args, kwargs in _Recorder.launches if any(isinstance(a, float) for a in args)]
    assert floats, f"{variant} passes no float argument"
    for kernel, args, kwargs in floats:
        compiled = _compile(kernel, args, kwargs, float_type="fp64")
        assert compiled.asm.get("cubin"), f"{variant}: no cubin"
        ttir = compiled.asm["ttir"]
        assert "f64" in ttir, "the float argument is fp64 in the signature"
        arithmetic = [line for line in ttir.splitlines() if "f64" in line and "arith.extf" not in line and "tt.func" not in line
                      and "arith.truncf" not in line]
        assert not arithmetic, f"{variant}: fp64 arithmetic in the kernel: {arithmetic[:3]}"
