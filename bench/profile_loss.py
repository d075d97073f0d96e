"""Time the training loss alone on one device: ours (the output projection fused with the loss,
in chunks: transformer/training/loss.py) at several chunk sizes against full (N, V) logits and
torch's cross entropy, forward and backward, bf16 autocast; then the profiler's top kernels of ours.

    python bench/profile_loss.py [--tokens 20736] [--vocab 32000 6000] [--d-model 512]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from transformer.training import loss as loss_mod


def timed(fn, steps: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of ``fn`` on the device."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def top_kernels(fn, rows: int) -> str:
    """The profiler's table of the CUDA kernels of three calls of ``fn``, longest first."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(
        sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=20736)
    p.add_argument("--vocab", type=int, nargs="+", default=[32000, 6000])
    p.add_argument("--d-model", type=int, default=512)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_loss.py times CUDA kernels: it needs a CUDA GPU")
    dev = "cuda"
    torch.manual_seed(0)
    default = loss_mod.CHUNK_ELEMENTS["cuda"]
    print(f"torch {torch.__version__} {torch.cuda.get_device_name()} tokens={args.tokens}")
    print("| vocab | system | chunk rows | ms fwd+bwd |")
    print("|---:|---|---:|---:|")
    for vocab in args.vocab:
        h = torch.randn(args.tokens, args.d_model, device=dev, requires_grad=True)
        w = (0.02 * torch.randn(vocab, args.d_model, device=dev)).requires_grad_()
        y = torch.randint(1, vocab, (args.tokens,), device=dev)

        def ours(h=h, w=w, y=y) -> None:
            with torch.autocast(dev, dtype=torch.bfloat16):
                total, _, _ = loss_mod.label_smoothed_loss(h, w, y, 0.1, 0, args.tokens)
            total.backward()

        def full(h=h, w=w, y=y) -> None:
            with torch.autocast(dev, dtype=torch.bfloat16):
                logits = h @ w.T
                total = F.cross_entropy(logits.float(), y, label_smoothing=0.1, reduction="sum")
            total.backward()

        for elements in (default >> 2, default, default << 2, vocab * args.tokens):
            loss_mod.CHUNK_ELEMENTS["cuda"] = elements
            rows = max(1, elements // vocab)
            print(f"| {vocab} | ours | {min(rows, args.tokens)} | {timed(ours):.2f} |")
        loss_mod.CHUNK_ELEMENTS["cuda"] = default
        print(f"| {vocab} | full logits, F.cross_entropy | - | {timed(full):.2f} |")
        print(f"\nours, vocab {vocab}, default chunks, 3 steps:")
        print(top_kernels(ours, 14))
        print(f"\nfull logits, vocab {vocab}, 3 steps:")
        print(top_kernels(full, 10))


if __name__ == "__main__":
    main()
