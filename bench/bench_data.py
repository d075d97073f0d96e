"""Data pipeline speed: raw Multi30k files -> cached token ids (cold, then cached), and loader
throughput in batches/s.

    MULTI30K_DIR=../shared/data/multi30k python bench/bench_data.py
    python bench/bench_data.py --root ../shared/data/multi30k --num-workers 0 2 --model-steps 3

The cold build (SentencePiece training, tokenizing, saving) goes into a fresh temporary cache
directory; the cached build is a new datamodule over the same directory. Imports are not timed.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

from transformer.data.datamodule import TranslationDataModule

log = logging.getLogger("bench_data")


def build(args: argparse.Namespace, cache_dir: str, num_workers: int) -> TranslationDataModule:
    dm = TranslationDataModule(
        source="multi30k", root=args.root, download=False, src_lang=args.src, tgt_lang=args.tgt,
        vocab_size=args.vocab_size, spm_model_type=args.spm_model_type,
        max_tokens=args.max_tokens, num_workers=num_workers, cache_dir=cache_dir,
    )  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    return dm


def throughput(dm: TranslationDataModule, epochs: int) -> tuple[float, int, float]:
    """(batches/s, batches per epoch, mean real tokens per batch) over ``epochs`` epochs, after
    one untimed warm-up batch (worker start-up)."""
    loader = dm.train_dataloader()
    next(iter(loader))
    n, tokens = 0, 0
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        loader.batch_sampler.set_epoch(epoch)
        for batch in loader:
            n += 1
            tokens += batch.num_tgt_tokens
    return n / (time.perf_counter() - start), n // epochs, tokens / n


def step_time(dm: TranslationDataModule, steps: int) -> float:
    """Seconds per forward+backward+update of a Transformer-base stand-in (``torch.nn.Transformer``,
    d_model 512, 6+6 layers) on this loader's batches, on CUDA when there is one: what one
    training step consumes."""
    import torch
    from lightning.fabric.utilities.apply_func import move_data_to_device

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    emb = torch.nn.Embedding(dm.src_vocab_size, 512, padding_idx=dm.pad_id)
    model = torch.nn.Transformer(512, 8, 6, 6, 2048, batch_first=True)
    out = torch.nn.Linear(512, dm.tgt_vocab_size)
    for m in (emb, model, out):
        m.to(device)
    params = [*emb.parameters(), *model.parameters(), *out.parameters()]
    opt = torch.optim.Adam(params)
    loader = iter(dm.train_dataloader())
    times = []
    for _ in range(steps + 1):
        b = move_data_to_device(next(loader), device)
        start = time.perf_counter()
        t = b.tgt_in.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=device).triu(1)  # True = masked
        h = model(
            emb(b.src), emb(b.tgt_in), tgt_mask=causal, src_key_padding_mask=b.src_pad_mask,
            tgt_key_padding_mask=b.tgt_in.eq(dm.pad_id), memory_key_padding_mask=b.src_pad_mask,
        )  # fmt: skip
        loss = torch.nn.functional.cross_entropy(
            out(h).flatten(0, 1), b.labels.flatten(), ignore_index=dm.pad_id
        )
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sum(times[1:]) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.environ.get("MULTI30K_DIR"))
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--spm-model-type", default="unigram")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--model-steps", type=int, default=0, help="time this many training steps")
    args = parser.parse_args()
    if not args.root:
        parser.error("pass --root DIR or set MULTI30K_DIR to the Multi30k files")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    log.info("cpu cores: %s, %s-%s, vocab %d", os.cpu_count(), args.src, args.tgt, args.vocab_size)
    with tempfile.TemporaryDirectory() as cache_dir:
        start = time.perf_counter()
        build(args, cache_dir, 0)
        log.info("cold build (spm + tokenize + cache): %.2f s", time.perf_counter() - start)
        start = time.perf_counter()
        build(args, cache_dir, 0)
        log.info("cached build: %.3f s", time.perf_counter() - start)
        for workers in args.num_workers:
            rate, per_epoch, tokens = throughput(build(args, cache_dir, workers), args.epochs)
            log.info(
                "loader, max_tokens=%d, num_workers=%d: %.0f batches/s (%d batches/epoch, "
                "%.0f target tokens/batch)", args.max_tokens, workers, rate, per_epoch, tokens,
            )  # fmt: skip
        if args.model_steps:
            seconds = step_time(build(args, cache_dir, 0), args.model_steps)
            log.info("Transformer-base training step: %.3f s (%.2f steps/s)", seconds, 1 / seconds)


if __name__ == "__main__":
    main()
