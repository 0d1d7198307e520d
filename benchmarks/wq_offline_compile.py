"""Compile graphopt::wq_linear's Triton kernels for a GPU architecture without a GPU: every
autotune config of a regime (gemv, small, prefill: wq_matmul's tiled kernel; decode: wq_gemv's), with the registers, local-memory spills and shared memory that
ptxas reports and the width of the K loop's pipelined weight copies (Triton's TTGIR). A config
that fails to compile, spills, or copies its weights narrower than 16 bytes shows here before
a GPU run.

    python benchmarks/wq_offline_compile.py                      # all regimes, int4 and int8, sm_90
    python benchmarks/wq_offline_compile.py --regimes gemv --bits 4 --split-k 4
    python benchmarks/wq_offline_compile.py --regimes decode --rows 1,16   # the decode GEMV at 1 and 16 rows

For the decode GEMV it also counts the K loop's SASS instructions per weight value a thread
handles (the kernel is bound by instruction issue well before the HBM at one row) and checks
that the PTX does no flush-to-zero arithmetic (the kernel's subnormal products need it off).

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


def _cuobjdump(cubin: bytes, flag: str) -> str:
    import triton

    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)


def _loop_instructions(sass: str) -> int:
    """Instructions of the longest backward branch's body (the K loop)."""
    addresses = [(int(a, 16), line) for a, line in re.findall(r"/\*([0-9a-f]{4,})\*/([^\n]*)", sass)]
    longest = 0
    for address, line in addresses:
        target = re.search(r"BRA\s+[`(]*0x([0-9a-f]+)", line)
        if target and int(target.group(1), 16) < address:
            lo = int(target.group(1), 16)
            longest = max(longest, sum(1 for a, _ in addresses if lo <= a <= address))
    return longest


def compile_decode_config(config: dict[str, int], bits: int, block_size: int, rows: int, arch: int,
                          zeros: bool = False) -> dict[str, Any]:
    """One config of wq_gemv's kernel at `rows` rows: registers, spills, shared memory, weight copy width,
    the K loop's instructions per weight value of a thread, and whether the PTX flushes subnormals."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from graphopt.kernels._triton import next_power_of_2
    from graphopt.kernels.wq_gemv import _wq_gemv_kernel

    constants = dict(BITS=bits, QBLOCK=block_size, HAS_ZEROS=zeros, HAS_BIAS=False, BLOCK_M=next_power_of_2(rows),
                     BLOCK_N=config["BLOCK_N"], K_WORDS=config["K_WORDS"], SPLIT_K=config["SPLIT_K"], STAGES=config["STAGES"])
    names = _wq_gemv_kernel.arg_names
    signature = {n: "constexpr" if n in constants else _POINTERS.get(n, "i32") for n in names}
    divisible = [*_POINTERS, "K", "KB", "N", "stride_ww", "stride_xm", "stride_om", "stride_sn"]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    kernel = triton.compile(ASTSource(_wq_gemv_kernel, signature, constants, attrs), target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": config["num_warps"], "num_stages": config["num_stages"]})
    found = dict(re.findall(r"(REG|LOCAL):(\d+)", _cuobjdump(kernel.asm["cubin"], "-res-usage")))
    widths = [4 * int(c) for c in re.findall(r"async_copy_global_to_local[^\n]*contiguity = (\d+)[^\n]*ptr<i32>", kernel.asm["ttgir"])]
    per_word = 32 // bits
    words_per_block = block_size // per_word
    tile_words = max(config["K_WORDS"], words_per_block) * config["BLOCK_N"]
    values_per_thread = tile_words * per_word / (32 * config["num_warps"])
    loop = _loop_instructions(_cuobjdump(kernel.asm["cubin"], "-sass"))
    return {"registers": int(found.get("REG", -1)), "local_bytes": int(found.get("LOCAL", -1)), "shared_bytes": kernel.metadata.shared,
            "weight_copy_bytes": min(widths, default=0), "loop_per_value": loop / values_per_thread,
            "flushes_subnormals": ".ftz" in kernel.asm["ptx"]}


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
    parser.add_argument("--regimes", default="gemv,small,prefill,decode")
    parser.add_argument("--rows", default="1,8,16", help="the decode GEMV's rows (M)")
    parser.add_argument("--bits", default="4,8")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--split-k", type=int, default=1)
    parser.add_argument("--arch", type=int, default=90, help="compute capability x10 (90: H100/H200)")
    args = parser.parse_args(argv)
    from graphopt.kernels import wq_gemv, wq_matmul

    lists = {"gemv": wq_matmul.GEMV_CONFIGS, "small": wq_matmul.SMALL_M_CONFIGS, "prefill": wq_matmul.PREFILL_CONFIGS, "decode": []}
    regimes = args.regimes.split(",")
    try:
        bits_list = [int(b) for b in args.bits.split(",")]
        rows_list = [int(r) for r in args.rows.split(",")]
        if any(r not in lists for r in regimes) or any(b not in (4, 8) for b in bits_list) or args.split_k < 1:
            raise ValueError
        if any(not 1 <= r <= wq_gemv.GEMV_MAX_M for r in rows_list):
            raise ValueError
    except ValueError:
        print(f"error: regimes are {', '.join(lists)}; bits 4 or 8; split-k >= 1; rows 1 to {wq_gemv.GEMV_MAX_M}", file=sys.stderr)
        return 2
    failed = 0
    for regime in regimes:
        for bits in bits_list:
            if regime == "decode":
                for rows in rows_list:
                    for config in wq_gemv.configs_for(rows, True):
                        name = (f"decode  int{bits} M{rows} N{config['BLOCK_N']}xKW{config['K_WORDS']} split{config['SPLIT_K']} "
                                f"w{config['num_warps']} s{config['num_stages']}")
                        try:
                            r = compile_decode_config(config, bits, args.block_size, rows, args.arch)
                        except Exception as error:  # noqa: BLE001 - report and go on
                            failed += 1
                            print(f"{name:44s} FAILED {type(error).__name__}: {str(error)[:200]}", flush=True)
                            continue
                        print(f"{name:44s} regs {r['registers']:3d}  local {r['local_bytes']:4d} B  shared {r['shared_bytes']:6d} B  "
                              f"weight copies {r['weight_copy_bytes']:2d} B  loop {r['loop_per_value']:.2f} instr/value"
                              + ("  FLUSHES SUBNORMALS" if r["flushes_subnormals"] else ""), flush=True)
                        failed += r["flushes_subnormals"]
                continue
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
