"""Decoding speed (beam search, or greedy with --beam 1): our cached decoder, our uncached
decoder, Hugging Face MarianMTModel.generate.

Sources are the real sentences of a Multi30k split, tokenized by the data pipeline (a joint
SentencePiece model trained on its training split); the models have the same sizes and random
weights. Random weights rarely choose eos, so each system is made to produce a set number of tokens
per sentence: with ``--lengths equal``, exactly ``--length`` for every sentence, in the file's
order (each step's work the same for all systems); with ``--lengths reference``, as many as its
reference translation has pieces, in batches of sentences sorted by source length: sentences
then end at different steps, as a trained model's do, and a decoder that drops finished sentences
from the batch does less work. Batches hold ``--batch`` sentences, or with ``--max-tokens N`` as
many as ``evaluate.py`` puts in one (N source tokens with padding; its default is 4096, about 200
Multi30k sentences). Systems alternate batch by batch; the table gives sentences/s and the ratios.

    pip install transformers   # only for the MarianMTModel column
    python bench/bench_decode.py --root ../shared/data/multi30k
    python bench/bench_decode.py --root DIR --limit 200 --no-uncached
    python bench/bench_decode.py --root DIR --beam 1 --no-uncached   # greedy
    python bench/bench_decode.py --root DIR --lengths reference --no-uncached
    python bench/bench_decode.py --root DIR --lengths reference --no-uncached --max-tokens 4096
    python bench/bench_decode.py --root DIR --no-uncached --dtype bfloat16   # every system
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import torch

from bench.common import marian
from transformer import Transformer, TransformerConfig
from transformer.data.collate import encode_sources, pad
from transformer.data.datamodule import TranslationDataModule
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer.decoding import DecodeOptions, beam_search, greedy_decode
from transformer.evaluation import DTYPES
from transformer.translate import length_batches


def source_batches(
    args: argparse.Namespace, device: torch.device, limit: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of (source ids (B, S), output lengths (B,)), as ``--lengths`` says."""
    dm = TranslationDataModule(
        root=args.root, src_lang=args.src_lang, tgt_lang=args.tgt_lang,
        vocab_size=args.vocab, cache_dir=args.cache_dir, num_workers=0,
    )  # fmt: skip
    dm.prepare_data()
    dm.setup()
    ids = encode_sources(dm.src_tokenizer, dm.sources(args.split)[: args.limit], limit)
    if args.lengths == "reference":
        lengths = [len(dm.tgt_tokenizer.encode(r)) for r in dm.references(args.split)]
    else:
        lengths = [args.length] * len(ids)
    if args.max_tokens:  # evaluate.py's batches (Translator.translate)
        groups = length_batches({i: len(x) for i, x in enumerate(ids)}, args.max_tokens)
    else:
        order = list(range(len(ids)))
        if args.lengths == "reference":
            order.sort(key=lambda i: len(ids[i]), reverse=True)
        groups = [order[start : start + args.batch] for start in range(0, len(order), args.batch)]
    batches = []
    for rows in groups:
        lens = torch.tensor([min(lengths[i], limit - 2) for i in rows], device=device)
        batches.append((pad([ids[i] for i in rows], PAD_ID, device), lens))
    return batches


class ExactLengths:
    """A `generate()` logits processor: row r of sentence r // beams ends after exactly
    lengths[sentence] tokens (eos banned before, forced then)."""

    def __init__(self, lengths: torch.Tensor, beams: int) -> None:
        self.lengths = lengths.repeat_interleave(beams)  # (B * beams,)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids.size(1) - 1  # after the decoder start token
        at_end = (self.lengths <= generated).unsqueeze(1)  # (N, 1)
        is_eos = torch.arange(scores.size(1), device=scores.device) == EOS_ID
        return scores.masked_fill(at_end != is_eos, float("-inf"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--root", default=os.environ.get("MULTI30K_DIR", "data/multi30k"))
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--cache-dir", default="data/cache")
    p.add_argument("--limit", type=int, default=None, help="first N sentences only")
    p.add_argument("--batch", type=int, default=50, help="sentences per batch")
    p.add_argument("--max-tokens", type=int, default=0,
                   help="batch as evaluate.py does instead (sorted by source length, at most N "
                        "source tokens with padding; its default is 4096)")  # fmt: skip
    p.add_argument("--beam", type=int, default=5, help="1 = greedy decoding")
    p.add_argument("--lengths", choices=["equal", "reference"], default="equal")
    p.add_argument("--length", type=int, default=25, help="tokens per sentence (--lengths equal)")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-ff", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--dtype", choices=list(DTYPES), default="float32",
                   help="every system's weights (evaluate.py's dtype=)")  # fmt: skip
    p.add_argument("--no-uncached", action="store_true", help="skip our uncached decoder")
    p.add_argument("--no-marian", action="store_true", help="skip MarianMTModel")
    args = p.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    cfg = TransformerConfig(
        args.vocab, args.vocab, d_model=args.d_model, num_heads=args.heads,
        num_encoder_layers=args.layers, num_decoder_layers=args.layers, d_ff=args.d_ff,
        share_all_embeddings=True,
    )  # fmt: skip
    dtype = DTYPES[args.dtype]
    ours = Transformer(cfg).to(device, dtype).eval()
    n = args.length

    # Each sentence ends after exactly its set number of tokens (max_lengths: its eos forced
    # there; before it, eos is banned with equal lengths, and random weights practically never
    # choose it with reference lengths).
    strategy = "greedy" if args.beam == 1 else "beam"
    min_len = n if args.lengths == "equal" else 1
    options = DecodeOptions(strategy=strategy, beam_size=args.beam, min_len=min_len)
    ids = dict(bos_id=BOS_ID, eos_id=EOS_ID)
    search = greedy_decode if strategy == "greedy" else beam_search
    systems = {
        "ours, cached": lambda src, lens: search(ours, src, options, **ids, max_lengths=lens)
    }
    if not args.no_uncached:  # beam search of size 1 is greedy decoding (tests/test_decoding.py)
        systems["ours, uncached"] = lambda src, lens: beam_search(
            ours, src, options, **ids, max_lengths=lens, use_cache=False
        )
    if not args.no_marian:
        from transformers import LogitsProcessorList

        hf = marian(cfg).to(device, dtype).eval()

        def hf_generate(src: torch.Tensor, lens: torch.Tensor):
            with torch.no_grad():
                return hf.generate(
                    input_ids=src, attention_mask=src.ne(PAD_ID), num_beams=args.beam,
                    max_new_tokens=int(lens.max()) + 1, do_sample=False,
                    logits_processor=LogitsProcessorList([ExactLengths(lens, args.beam)]),
                )  # fmt: skip

        systems["MarianMTModel.generate"] = hf_generate

    batches = source_batches(args, device, cfg.max_positions)
    systems_time = {name: 0.0 for name in systems}
    per_batch = {name: [] for name in systems}
    for src, lens in [batches[0]] + batches:  # the first batch twice: warm-up, not timed
        for name, run in systems.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            run(src, lens)
            if device.type == "cuda":
                torch.cuda.synchronize()
            per_batch[name].append(time.perf_counter() - start)
    for name in systems:
        per_batch[name] = per_batch[name][1:]
        systems_time[name] = sum(per_batch[name])

    sentences = sum(src.size(0) for src, _ in batches)
    tokens = sum(int(lens.sum()) for _, lens in batches)
    print(
        f"device={device} threads={torch.get_num_threads()} split={args.split} "
        f"sentences={sentences} batches={len(batches)} beam={args.beam} lengths={args.lengths} "
        f"tokens/sentence={tokens / sentences:.1f} "
        f"d_model={args.d_model} layers={args.layers}+{args.layers} vocab={args.vocab} "
        f"dtype={args.dtype}"
    )
    print("| system | seconds | sentences/s |")
    print("|---|---|---|")
    for name, seconds in systems_time.items():
        print(f"| {name} | {seconds:.1f} | {sentences / seconds:.1f} |")
    for name in list(systems)[1:]:
        ratios = [b / a for a, b in zip(per_batch["ours, cached"], per_batch[name], strict=True)]
        print(f"speed-up of ours, cached over {name}: {statistics.median(ratios):.2f}x "
              f"(median of per-batch ratios; total time "
              f"{systems_time[name] / systems_time['ours, cached']:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
