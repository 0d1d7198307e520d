"""Which autotune config of graphopt's Triton attention kernel wins at the shapes of the
torch.compile benchmark's models, and how long each takes (GPU).

Every config the autotuner tries is compiled on first use, which is most of graphopt's
compile time on a cold machine (Triton's cache empty): this says which configs earn
their place in graphopt/kernels/attention.py's lists.

    python3 benchmarks/attention_autotune.py --out $OUT/attention_autotune.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from triton_kernels import _environment, write_json_atomically  # noqa: E402

#: (label, batch, heads, seq, head dim, causal, additive mask)
SHAPES = (
    ("BERT-base b8 s128", 8, 12, 128, 64, False, True),
    ("ViT-base b8", 8, 12, 197, 64, False, False),
    ("GPT-2 b1 s512", 1, 12, 512, 64, True, False),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import graphopt.kernels  # noqa: F401
    from graphopt.kernels import attention as attention_module

    rows: list[dict[str, Any]] = []
    for label, batch, heads, seq, dim, causal, masked in SHAPES:
        # q, k and v as the packed projection leaves them: views of one [b, s, 3, h, d] tensor
        packed = torch.randn(batch, seq, 3, heads, dim, device="cuda", dtype=torch.float16)
        q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))
        mask = torch.zeros(batch, 1, 1, seq, device="cuda", dtype=torch.float16) if masked else None
        tuner = attention_module._attention_fwd_tuned
        before = set(tuner.cache)
        start = time.perf_counter()
        torch.ops.graphopt.attention(q, k, v, mask, causal)
        torch.cuda.synchronize()
        first_call_s = time.perf_counter() - start
        timings = {str(c): [round(float(t), 5) for t in ts] for c, ts in (getattr(tuner, "configs_timings", None) or {}).items()}
        winners = {str(key): str(config) for key, config in tuner.cache.items() if key not in before}
        rows.append({"shape": label, "first_call_s": round(first_call_s, 2), "winner": winners, "timings_ms": timings})
        print(f"{label}: first call {first_call_s:.2f} s; winner {winners}")
        for config, ts in timings.items():
            print(f"    {ts[0]:.4f} ms  {config}")
    if args.out:
        write_json_atomically({"benchmark": "attention_autotune", "environment": _environment(torch.device("cuda")), "rows": rows}, args.out)


if __name__ == "__main__":
    main()
