"""Train-step speed of our Transformer against torch.nn.Transformer of the same sizes.

All models get the same embeddings, sinusoidal positions and tied output projection, so the
comparison is about the attention and layer code. They train on the same right-padded batches,
alternating step by step, and the script reports target (non-pad) tokens per second and the ratio.

    python bench/bench_model.py                       # d_model 512, 8 heads, 6+6, ffn 2048, V 8000
    python bench/bench_model.py --dtype bf16 --steps 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import torch

from bench.common import (
    TorchTransformer,
    autocast_factory,
    logits_loss,
    synchronize,
    train_step,
)
from transformer import Transformer, TransformerConfig

PAD, BOS = 0, 2


def make_batches(n: int, sentences: int, vocab: int, device: torch.device, seed: int = 0):
    """Right-padded (src, tgt_in, labels) with lengths 8-40 like Multi30k's sentence pieces."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        src_len = torch.randint(8, 41, (sentences,), generator=g)
        tgt_len = (src_len.float() * 1.1).long().clamp(max=44)
        src = torch.full((sentences, int(src_len.max())), PAD)
        tgt = torch.full((sentences, int(tgt_len.max()) + 1), PAD)
        for i in range(sentences):
            src[i, : src_len[i]] = torch.randint(4, vocab, (int(src_len[i]),), generator=g)
            tgt[i, 0] = BOS
            tgt[i, 1 : tgt_len[i] + 1] = torch.randint(4, vocab, (int(tgt_len[i]),), generator=g)
        batches.append((src.to(device), tgt[:, :-1].to(device), tgt[:, 1:].to(device)))
    return batches


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-ff", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--sentences", type=int, default=32, help="sentences per batch")
    p.add_argument("--steps", type=int, default=10, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--post-norm", action="store_true")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = TransformerConfig(
        args.vocab, args.vocab, d_model=args.d_model, num_heads=args.heads,
        num_encoder_layers=args.layers, num_decoder_layers=args.layers, d_ff=args.d_ff,
        norm_first=not args.post_norm, share_all_embeddings=True,
    )  # fmt: skip
    models = {
        "ours": Transformer(cfg),
        "torch.nn.Transformer": TorchTransformer(cfg),
        "torch.nn.Transformer, no target padding mask": TorchTransformer(cfg, tgt_pad_mask=False),
    }
    opts, losses = {}, {}
    for name, model in models.items():
        model.to(device).train()
        opts[name] = torch.optim.AdamW(model.parameters(), lr=1e-4)
        losses[name] = logits_loss(model)
    autocast = autocast_factory(device, args.dtype)

    batches = make_batches(args.warmup + args.steps, args.sentences, args.vocab, device)
    rates: dict[str, list[float]] = {name: [] for name in models}
    for i, batch in enumerate(batches):
        tokens = int(batch[2].ne(PAD).sum())
        for name in models:  # alternate on the same batch
            synchronize(device)
            start = time.perf_counter()
            train_step(losses[name], opts[name], batch, tokens, autocast)
            synchronize(device)
            if i >= args.warmup:
                rates[name].append(tokens / (time.perf_counter() - start))

    pad_share = 1 - sum(int(b[2].ne(PAD).sum()) for b in batches) / sum(
        b[2].numel() for b in batches
    )
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    print(
        f"device={device} threads={torch.get_num_threads()} dtype={args.dtype} "
        f"d_model={args.d_model} heads={args.heads} layers={args.layers}+{args.layers} "
        f"d_ff={args.d_ff} vocab={args.vocab} sentences/batch={args.sentences} "
        f"target padding={pad_share:.0%} steps={args.steps}"
    )
    print("| model | parameters | target tokens/s (median) |")
    print("|---|---|---|")
    for name in models:
        print(f"| {name} | {params[name] / 1e6:.1f}M | {statistics.median(rates[name]):,.0f} |")
    for name in list(models)[1:]:
        ratios = [a / b for a, b in zip(rates["ours"], rates[name], strict=True)]
        print(f"ratio ours / {name} (median of per-batch ratios): {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
