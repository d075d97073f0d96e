"""PyTorch's attention kernel (``F.scaled_dot_product_attention``) in bf16 against float32.

Why ``transformer.attend.sdpa`` keeps bf16/fp16 inputs away from the bf16 kernel on CPU: on each
shape, the time of the kernel in float32, in bf16, and on bf16 inputs cast to float32 and back (what
``sdpa`` does on CPU for inference; casts included; training computes attention by hand in bf16
there instead, see docs/benchmarks.md). Shapes: a training batch (forward and backward, causal
self-attention) and the two attention calls of one beam-search step (50 sentences x 5 beams: one
new query per row against the cached keys of its row; cross-attention, each sentence's 5 beam
queries against its source).

    python bench/bench_attention.py                 # the default device (a GPU when there is one)
    python bench/bench_attention.py --device cpu --repeat 50
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import torch
import torch.nn.functional as F

from bench.common import synchronize

Shape = tuple[int, int, int, int]  # (B, H, T, Dh)
CASES: dict[str, tuple[Shape, Shape, bool, bool]] = {  # q shape, k/v shape, causal, backward
    "train: 160 x 25 tokens, causal, fwd+bwd": ((160, 8, 25, 64), (160, 8, 25, 64), True, True),
    "train: 64 x 60 tokens, causal, fwd+bwd": ((64, 8, 60, 64), (64, 8, 60, 64), True, True),
    "decode: self, 250 rows x 1 query, 20 keys": ((250, 8, 1, 64), (250, 8, 20, 64), False, False),
    "decode: cross, 50 x 5 queries, 16 keys": ((50, 8, 5, 64), (50, 8, 16, 64), False, False),
}


def timed(run: Callable[[], None], device: torch.device, repeat: int) -> float:
    """Median milliseconds of ``repeat`` calls after one untimed call."""
    run()
    times = []
    for _ in range(repeat):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def attention_call(
    q_shape: Shape, kv_shape: Shape, causal: bool, backward: bool, dtype, cast, device
):
    """One call (and its backward) on inputs of ``dtype``, computed in ``cast`` if given."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(s, generator=g).to(device, dtype).requires_grad_(backward)
        for s in (q_shape, kv_shape, kv_shape)
    )

    def run() -> None:
        inputs = (q, k, v) if cast is None else (q.to(cast), k.to(cast), v.to(cast))
        out = F.scaled_dot_product_attention(*inputs, is_causal=causal).to(dtype)
        if backward:
            out.sum().backward()

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--repeat", type=int, default=30)
    args = p.parse_args()
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    variants = {
        "float32": (torch.float32, None),
        "bf16": (torch.bfloat16, None),
        "bf16 via float32": (torch.bfloat16, torch.float32),
    }
    print(f"device={device} threads={torch.get_num_threads()} torch={torch.__version__}")
    print(f"| shape | {' | '.join(variants)} | bf16 / bf16 via float32 |")
    print(f"|---|{'---|' * len(variants)}---|")
    for name, (q_shape, kv_shape, causal, backward) in CASES.items():
        ms = {
            label: timed(
                attention_call(q_shape, kv_shape, causal, backward, dtype, cast, device),
                device,
                args.repeat,
            )  # fmt: skip
            for label, (dtype, cast) in variants.items()
        }
        cells = " | ".join(f"{t:.2f} ms" for t in ms.values())
        print(f"| {name} | {cells} | {ms['bf16'] / ms['bf16 via float32']:.2f}x |")


if __name__ == "__main__":
    main()
