"""Data pipeline speed: raw Multi30k files -> cached token ids (cold, then cached), and loader
throughput in batches/s.

    MULTI30K_DIR=../shared/data/multi30k python bench/bench_data.py
    python bench/bench_data.py --root ../shared/data/multi30k --num-workers 0 2 --model-steps 3
    python bench/bench_data.py --root ../shared/data/multi30k --num-workers 0 \
        --spm-sampling none 0.1,64 0.1,-1

``--spm-sampling``: the loader with ``data.spm_sampling`` at each ``alpha[,nbest]`` (``none``:
off; with ``--spm-model-type bpe``, ``alpha`` alone), and the draws a side takes (1 + the share
drawn again for their batch's budget).

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


def build(
    args: argparse.Namespace, cache_dir: str, num_workers: int, sampling: str = "none"
) -> TranslationDataModule:
    dm = TranslationDataModule(
        source="multi30k", root=args.root, download=False, src_lang=args.src, tgt_lang=args.tgt,
        vocab_size=args.vocab_size, spm_model_type=args.spm_model_type,
        max_tokens=args.max_tokens, num_workers=num_workers, cache_dir=cache_dir,
        spm_sampling=sampling_options(sampling),
    )  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    return dm


def sampling_options(spec: str) -> dict | None:
    """``alpha[,nbest]`` as ``data.spm_sampling``; ``none``: None."""
    if spec == "none":
        return None
    alpha, *nbest = spec.split(",")
    return {"alpha": float(alpha), **({"nbest": int(nbest[0])} if nbest else {})}


def throughput(
    dm: TranslationDataModule, epochs: int, draws: DrawCounter
) -> tuple[float, int, float, float]:
    """(batches/s, batches per epoch, mean real tokens per batch, draws a side) over ``epochs``
    epochs, after one untimed warm-up batch (worker start-up)."""
    loader = dm.train_dataloader()
    next(iter(loader))
    n, tokens, pairs, drawn = 0, 0, 0, draws.count
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        loader.batch_sampler.set_epoch(epoch)
        for batch in loader:
            n += 1
            tokens += batch.num_tgt_tokens
            pairs += int((batch.ids >= 0).sum())
    seconds = time.perf_counter() - start
    return n / seconds, n // epochs, tokens / n, (draws.count - drawn) / (2 * pairs)


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


class DrawCounter:
    """Counts :meth:`Tokenizer.resample` calls in this process (num_workers=0)."""

    def __init__(self) -> None:
        from transformer.data.tokenizer import Tokenizer

        self.count, resample = 0, Tokenizer.resample

        def counted(tok, *args):
            self.count += 1
            return resample(tok, *args)

        Tokenizer.resample = counted


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
    parser.add_argument("--spm-sampling", nargs="+", default=["none"], metavar="ALPHA[,NBEST]")
    args = parser.parse_args()
    if not args.root:
        parser.error("pass --root DIR or set MULTI30K_DIR to the Multi30k files")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    logging.getLogger("transformer.data.subword_sampling").setLevel(logging.INFO)  # its growth
    log.info("cpu cores: %s, %s-%s, vocab %d", os.cpu_count(), args.src, args.tgt, args.vocab_size)
    with tempfile.TemporaryDirectory() as cache_dir:
        start = time.perf_counter()
        build(args, cache_dir, 0)
        log.info("cold build (spm + tokenize + cache): %.2f s", time.perf_counter() - start)
        start = time.perf_counter()
        build(args, cache_dir, 0)
        log.info("cached build: %.3f s", time.perf_counter() - start)
        draws = DrawCounter()
        for sampling in args.spm_sampling:
            for workers in args.num_workers:
                dm = build(args, cache_dir, workers, sampling)
                rate, per_epoch, tokens, per_side = throughput(dm, args.epochs, draws)
                log.info(
                    "loader, max_tokens=%d, spm_sampling=%s, num_workers=%d: %.0f batches/s "
                    "(%d batches/epoch, %.0f target tokens/batch%s)", args.max_tokens, sampling,
                    workers, rate, per_epoch, tokens,
                    f", {per_side:.3f} draws a side" if per_side else "",
                )  # fmt: skip
        if args.model_steps:
            seconds = step_time(build(args, cache_dir, 0), args.model_steps)
            log.info("Transformer-base training step: %.3f s (%.2f steps/s)", seconds, 1 / seconds)


if __name__ == "__main__":
    main()
