"""Eager training steps of this checkout against another's (a change against its parent), timed.

Each round runs every checkout once, in its own process and in turn (the order reversed every
other round), and times ``--steps`` training steps (``TranslationModule._loss`` forward, loss and
backward) on the same random batches after two untimed ones; it prints each checkout's median
step per round and how many times faster this checkout's step is in that round. On a shared
machine compare the ratios, not the times across runs.

    python bench/bench_step.py --checkout /tmp/parent             # this checkout vs the parent
    python bench/bench_step.py --checkout /tmp/parent --preset mini --precision 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
# TransformerConfig sizes; host-bound: transformer-base's graph at a tiny width
LAYERS = dict(num_encoder_layers=6, num_decoder_layers=6)
PRESETS = {
    "host-bound": dict(d_model=64, num_heads=8, d_ff=128, **LAYERS),
    "mini": dict(d_model=128, num_heads=4, num_encoder_layers=4, num_decoder_layers=4, d_ff=256),
}


def time_steps(preset: str, precision: str, tokens: int, steps: int) -> float:
    """Median seconds of ``steps`` training steps in the checkout this process imports."""
    import numpy as np
    import torch

    from transformer.data.collate import Collator
    from transformer.training import TranslationModule

    torch.manual_seed(0)
    sizes = dict(src_vocab_size=6000, tgt_vocab_size=6000, dropout=0.1, **PRESETS[preset])
    module = TranslationModule(sizes).train()
    rng = np.random.default_rng(0)
    length = 24
    pairs = [(rng.integers(4, 6000, rng.integers(length // 2, length)),) * 2 for _ in range(4)]
    rows = tokens // length
    batch = Collator()([(i, *pairs[i % 4]) for i in range(rows)])
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32

    def step() -> None:
        with torch.autocast("cpu", dtype=dtype, enabled=precision == "bf16"):
            loss, _, n = module._loss(batch)
        (loss / n).backward()
        module.zero_grad(set_to_none=True)

    times = []
    for i in range(steps + 2):
        start = time.perf_counter()
        step()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkout", action="append", default=[], help="another checkout")
    parser.add_argument("--preset", choices=PRESETS, default="host-bound")
    parser.add_argument("--precision", choices=["bf16", "32"], default="bf16")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens a batch, padding included")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # run in a checkout: print one time
    args = parser.parse_args()
    if args.worker:
        sys.path.insert(0, args.worker)
        print(json.dumps(time_steps(args.preset, args.precision, args.tokens, args.steps)))
        return
    checkouts = [HERE, *map(Path, args.checkout)]
    options = ["--preset", args.preset, "--precision", args.precision, "--tokens", str(args.tokens)]
    options += ["--steps", str(args.steps)]
    print(f"{args.preset}, {args.precision}, {args.tokens} tokens a batch, {args.steps} steps")
    for r in range(args.rounds):
        order = checkouts if r % 2 == 0 else checkouts[::-1]
        seconds = {}
        for checkout in order:
            command = [sys.executable, __file__, *options, "--worker", str(checkout)]
            out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=checkout)
            seconds[checkout] = json.loads(out.stdout.strip().splitlines()[-1])
        ours = seconds[HERE]
        cells = [f"this checkout {ours * 1e3:.1f} ms"]
        cells += [
            f"{c} {seconds[c] * 1e3:.1f} ms ({seconds[c] / ours:.2f}x)" for c in checkouts[1:]
        ]
        print(f"round {r + 1}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
