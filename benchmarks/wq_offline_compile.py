"""Compile graphopt::wq_linear's Triton kernel for a GPU architecture without a GPU: every
autotune config of a regime, with the registers, local-memory spills and shared memory that
ptxas reports and the width of the K loop's pipelined weight copies (Triton's TTGIR). A config
that fails to compile, spills, or copies its weights narrower than 16 bytes shows here before
a GPU run.

    python benchmarks/wq_offline_compile.py                      # all regimes, int4 and int8, sm_90
    python benchmarks/wq_offline_compile.py --regimes gemv --bits 4 --split-k 4

It uses Triton's compiler directly (ASTSource, the ptxas Triton ships); the K and N it assumes
are multiples of 128 (TinyLlama's), as Triton's specialization would see them.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: Integer arguments a launch at TinyLlama's shapes passes as multiples of 16 (Triton specializes them).
_DIVISIBLE = ("K", "KP", "KW", "KB", "N", "stride_ww", "stride_xm", "stride_om")
_POINTERS = {"x_ptr": "*fp16", "w_ptr": "*u8", "s_ptr": "*fp16", "z_ptr": "*u8", "b_ptr": "*fp16", "out_ptr": "*fp16",
             "part_ptr": "*fp32", "lock_ptr": "*i32"}


def compile_config(config: dict[str, int], bits: int, block_size: int, split_k: int, arch: int) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from graphopt.kernels.wq_matmul import _wq_kernel

    constants = dict(BITS=bits, QBLOCK=block_size, HAS_ZEROS=False, HAS_BIAS=False, SPLIT_K=split_k, ALLOW_TF32=True,
                     BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"], STAGES=config["STAGES"],
                     stride_xk=1)  # x's rows are contiguous: Triton specializes an argument equal to 1
    names = _wq_kernel.arg_names
    signature = {n: "constexpr" if n in constants else _POINTERS.get(n, "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in [*_POINTERS, *_DIVISIBLE]}
    kernel = triton.compile(ASTSource(_wq_kernel, signature, constants, attrs), target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": config["num_warps"], "num_stages": config["num_stages"]})
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    try:
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    found = dict(re.findall(r"(REG|LOCAL):(\d+)", usage))
    # the weights' pipelined copies (int32 words): bytes per copy, the narrowest (0: not pipelined)
    widths = [4 * int(c) for c in re.findall(r"async_copy_global_to_local[^\n]*contiguity = (\d+)[^\n]*ptr<i32>", kernel.asm["ttgir"])]
    return {"registers": int(found.get("REG", -1)), "local_bytes": int(found.get("LOCAL", -1)), "shared_bytes": kernel.metadata.shared,
            "weight_copy_bytes": min(widths, default=0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regimes", default="gemv,small,prefill")
    parser.add_argument("--bits", default="4,8")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--split-k", type=int, default=1)
    parser.add_argument("--arch", type=int, default=90, help="compute capability x10 (90: H100/H200)")
    args = parser.parse_args(argv)
    from graphopt.kernels import wq_matmul

    lists = {"gemv": wq_matmul.GEMV_CONFIGS, "small": wq_matmul.SMALL_M_CONFIGS, "prefill": wq_matmul.PREFILL_CONFIGS}
    regimes = args.regimes.split(",")
    try:
        bits_list = [int(b) for b in args.bits.split(",")]
        if any(r not in lists for r in regimes) or any(b not in (4, 8) for b in bits_list) or args.split_k < 1:
            raise ValueError
    except ValueError:
        print(f"error: regimes are {', '.join(lists)}; bits 4 or 8; split-k >= 1", file=sys.stderr)
        return 2
    failed = 0
    for regime in regimes:
        for bits in bits_list:
            for config in lists[regime]:
                name = f"{regime:7s} int{bits} M{config['BLOCK_M']}xN{config['BLOCK_N']}xK{config['BLOCK_K']} w{config['num_warps']} s{config['num_stages']}"
                try:
                    r = compile_config(config, bits, args.block_size, args.split_k, args.arch)
                except Exception as error:  # noqa: BLE001 - report and go on
                    failed += 1
                    print(f"{name:40s} FAILED {type(error).__name__}: {str(error)[:200]}", flush=True)
                    continue
                print(f"{name:40s} regs {r['registers']:3d}  local {r['local_bytes']:4d} B  shared {r['shared_bytes']:6d} B  "
                      f"weight copies {r['weight_copy_bytes']:2d} B", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
