"""Decoding speed, beam search and greedy: our cached decoder (and optionally our uncached one),
Hugging Face MarianMTModel.generate and CTranslate2, in one run.

Sources are the real sentences of a Multi30k split, tokenized by the data pipeline (a joint
SentencePiece model trained on its training split). Ours and CTranslate2 decode the same random
weights (ours exported); Marian has the same sizes and its own random weights. Random weights rarely
choose eos, so each system is made to produce a set number of tokens per sentence: with
``--lengths equal``, exactly ``--length`` for every sentence, in the file's order (each step's
work the same for all systems); with ``--lengths reference``, as many as its reference translation
has pieces, in batches of sentences sorted by source length: sentences then end at different
steps, as a trained model's do, and a decoder that drops finished sentences from the batch does
less work. Batches hold ``--batch`` sentences, or with ``--max-tokens N`` as many as
``evaluate.py`` puts in one (N source tokens with padding; its default is 4096, about 200
Multi30k sentences).

Each search first decodes every batch once with every system (the warm pass: CUDA graphs,
kernel autotuning, allocations), then once more timed, the systems alternating batch by batch
(their order rotating). The table gives sentences/s and target tokens/s (eos included) over the
timed pass and, per system, the median over batches of its time over ours; ``--out FILE`` keeps
every batch's seconds (JSON). The first lines say what ran where: the device, versions, our
decoding backend (attention kernel, static shapes, CUDA graphs, the whole search step),
CTranslate2's compute type. ``--compare-search`` adds ours with the other search step
(``decode.static_search`` flipped: the whole step at static shapes, one CUDA graph on a GPU,
against the model's step alone graphed and the search eager), so that its time / ours is the
ratio of the two paths.

    pip install transformers   # the MarianMTModel column; pip install -e ".[export]": CTranslate2
    python bench/bench_decode.py --root ../shared/data/multi30k
    python bench/bench_decode.py --root DIR --searches beam --lengths reference --max-tokens 4096
    python bench/bench_decode.py --root DIR --dtype bfloat16 --uncached   # every system in bf16
    python bench/bench_decode.py --root DIR --dry-run   # tiny sizes, seconds: does it all run?
    python bench/bench_decode.py --root DIR --compare-search --no-marian --no-ct2  # both paths
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import torch

from bench.common import marian
from transformer import Transformer, TransformerConfig
from transformer.data.collate import encode_sources, pad
from transformer.data.datamodule import TranslationDataModule
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from transformer.decoding import DecodeOptions, beam_search, greedy_decode
from transformer.decoding.runtime import backend, use_graphs, use_static_search
from transformer.device import DTYPES
from transformer.line_batches import length_batches

Batch = tuple[torch.Tensor, torch.Tensor]  # source ids (B, S), output lengths (B,)
System = Callable[[torch.Tensor, torch.Tensor], object]  # (src, lengths) -> anything


def source_batches(args: argparse.Namespace, device: torch.device, limit: int) -> tuple[
    list[Batch], Tokenizer
]:  # fmt: skip
    """Batches as ``--lengths`` and ``--max-tokens`` say, and the (joint) tokenizer."""
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
    return batches, dm.tgt_tokenizer


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


def ours(model: Transformer, options: DecodeOptions, use_cache: bool = True) -> System:
    search = greedy_decode if options.strategy == "greedy" else beam_search
    ids = dict(bos_id=BOS_ID, eos_id=EOS_ID, use_cache=use_cache)
    return lambda src, lens: search(model, src, options, **ids, max_lengths=lens)


def hugging_face(cfg: TransformerConfig, device: torch.device, dtype, beams: int) -> System:
    from transformers import LogitsProcessorList

    hf = marian(cfg).to(device, dtype).eval()

    def generate(src: torch.Tensor, lens: torch.Tensor):
        with torch.no_grad():
            return hf.generate(
                input_ids=src, attention_mask=src.ne(PAD_ID), num_beams=beams,
                max_new_tokens=int(lens.max()) + 1, do_sample=False,
                logits_processor=LogitsProcessorList([ExactLengths(lens, beams)]),
            )  # fmt: skip

    return generate


def ctranslate2_system(
    model: Transformer, tok: Tokenizer, device: torch.device, compute_type: str, beams: int
) -> tuple[System, str]:
    """Our weights exported to CTranslate2; each sentence made to decode its set tokens and one
    step more (our eos step), one call per length, as evaluate.py's engine=ctranslate2 calls it
    per length limit. Also its compute type."""
    import ctranslate2

    from transformer.export.ct2 import save_spec, transformer_spec

    vocab = tok.pieces(range(tok.vocab_size))
    directory = tempfile.mkdtemp(prefix="bench_decode.ct2.")
    save_spec(transformer_spec(copy.deepcopy(model).float().cpu(), vocab, vocab), directory)
    translator = ctranslate2.Translator(
        directory, device=device.type, compute_type=compute_type,
        intra_threads=torch.get_num_threads() if device.type == "cpu" else 0,
    )  # fmt: skip

    def translate(src: torch.Tensor, lens: torch.Tensor):
        groups: dict[int, list[list[str]]] = {}
        for row, length in zip(src.tolist(), lens.tolist(), strict=True):
            pieces = tok.pieces([i for i in row if i not in (PAD_ID, EOS_ID)])
            groups.setdefault(length, []).append(pieces)
        for length, sources in groups.items():
            translator.translate_batch(
                sources, beam_size=beams, min_decoding_length=length + 1,
                max_decoding_length=length + 1, max_input_length=0,
            )  # fmt: skip

    return translate, translator.compute_type


def timed(run: System, batch: Batch, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    run(*batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(systems: dict[str, System], batches: list[Batch], device) -> dict[str, list[float]]:
    """Every batch once with every system (warm), then again timed, alternating: seconds per
    batch of each system."""
    for batch in batches:
        for run in systems.values():
            run(*batch)
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    names = list(systems)
    for i, batch in enumerate(batches):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            seconds[name].append(timed(systems[name], batch, device))
    return seconds


def parse_args() -> argparse.Namespace:
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
    p.add_argument("--searches", nargs="+", choices=["beam", "greedy"], default=["beam", "greedy"])
    p.add_argument("--beam", type=int, default=5, help="beam search's beams")
    p.add_argument("--lengths", choices=["equal", "reference"], default="equal")
    p.add_argument("--length", type=int, default=25, help="tokens per sentence (--lengths equal)")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-ff", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--dtype", choices=list(DTYPES), default="float32",
                   help="every system's weights (evaluate.py's dtype=)")  # fmt: skip
    p.add_argument("--ct2-compute-type", default=None,
                   help="CTranslate2's compute type (default: --dtype; int8 ...)")  # fmt: skip
    p.add_argument("--graphs", choices=["auto", "on", "off"], default="auto",
                   help="ours: CUDA graphs (decode.graphs; auto: on a GPU)")  # fmt: skip
    p.add_argument("--sync-every", type=int, default=0, help="ours: decode.sync_every")
    p.add_argument("--static-search", choices=["on", "off"], default="off",
                   help="ours: the whole search step at static shapes, one CUDA graph "
                        "(decode.static_search)")  # fmt: skip
    p.add_argument("--compare-search", action="store_true",
                   help="also ours with the other search step (decode.static_search flipped): "
                        "its time / ours is the ratio of the two paths")  # fmt: skip
    p.add_argument("--uncached", action="store_true", help="also our uncached decoder")
    p.add_argument("--no-marian", action="store_true", help="skip MarianMTModel")
    p.add_argument("--no-ct2", action="store_true", help="skip CTranslate2")
    p.add_argument("--out", help="write every batch's seconds here (JSON)")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny sizes, 12 sentences: all systems, all searches")  # fmt: skip
    args = p.parse_args()
    if args.dry_run:
        args.limit, args.batch, args.length, args.vocab = 12, 5, 4, 500
        args.d_model, args.heads, args.layers, args.d_ff = 32, 2, 1, 64
    return args


def main() -> None:
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    cfg = TransformerConfig(
        args.vocab, args.vocab, d_model=args.d_model, num_heads=args.heads,
        num_encoder_layers=args.layers, num_decoder_layers=args.layers, d_ff=args.d_ff,
        share_all_embeddings=True,
    )  # fmt: skip
    model = Transformer(cfg).eval()
    batches, tok = source_batches(args, device, cfg.max_positions)
    graphs = {"auto": None, "on": True, "off": False}[args.graphs]
    static_search = args.static_search == "on"
    marian_installed = importlib.util.find_spec("transformers") is not None
    ct2_installed = importlib.util.find_spec("ctranslate2") is not None

    sentences = sum(src.size(0) for src, _ in batches)
    tokens = sum(int(lens.sum()) + lens.numel() for _, lens in batches)  # eos included
    where = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor()
    print(f"device={device} ({where or platform.machine()}) torch={torch.__version__} "
          f"threads={torch.get_num_threads()} dtype={args.dtype} split={args.split} "
          f"sentences={sentences} batches={len(batches)} lengths={args.lengths} "
          f"tokens/sentence={tokens / sentences:.1f} d_model={args.d_model} "
          f"layers={args.layers}+{args.layers} vocab={args.vocab}")  # fmt: skip
    probe = DecodeOptions(graphs=graphs, static_search=static_search)
    whole_step = use_static_search(probe, device, use_cache=True)
    print(f"ours: {backend(batches[0][0], dtype, use_graphs(probe, device), whole_step)}")

    results: dict[str, dict[str, list[float]]] = {}
    for search in args.searches:
        beams = args.beam if search == "beam" else 1
        # Equal lengths: eos banned before the set length (min_len); reference lengths: random
        # weights practically never choose it before.
        min_len = args.length if args.lengths == "equal" else 1
        options = DecodeOptions(
            strategy=search, beam_size=beams, min_len=min_len, graphs=graphs,
            sync_every=args.sync_every, static_search=whole_step,
        )  # fmt: skip
        systems = {"ours": ours(model.to(device, dtype), options)}
        if args.compare_search:  # the other search step, on the same weights
            other = dataclasses.replace(options, static_search=not whole_step)
            systems[f"ours, static_search={str(not whole_step).lower()}"] = ours(model, other)
        if args.uncached:
            systems["ours, uncached"] = ours(model, options, use_cache=False)
        if not args.no_marian and marian_installed:
            systems["MarianMTModel.generate"] = hugging_face(cfg, device, dtype, beams)
        if not args.no_ct2 and ct2_installed:
            compute_type = args.ct2_compute_type or args.dtype
            try:  # its wheel's CUDA build may not run on this machine's CUDA
                translate, compute_type = ctranslate2_system(
                    model, tok, device, compute_type, beams
                )
                systems[f"CTranslate2 ({compute_type})"] = translate
            except (RuntimeError, ValueError) as error:
                print(f"(CTranslate2 skipped: {error})")
        seconds = measure(systems, batches, device)
        results[search] = seconds

        print(f"\n{search}" + (f" {beams}" if search == "beam" else "") + ":")
        print("| system | seconds | sentences/s | target tokens/s | its time / ours |")
        print("|---|---|---|---|---|")
        for name, times in seconds.items():
            total = sum(times)
            ratios = [b / a for a, b in zip(seconds["ours"], times, strict=True)]
            ratio = f"{statistics.median(ratios):.2f}x (total {total / sum(seconds['ours']):.2f}x)"
            print(f"| {name} | {total:.2f} | {sentences / total:.1f} | {tokens / total:.0f} | "
                  f"{ratio if name != 'ours' else '-'} |")  # fmt: skip
    if not marian_installed and not args.no_marian:
        print("\n(MarianMTModel skipped: transformers is not installed)")
    if not ct2_installed and not args.no_ct2:
        print("(CTranslate2 skipped: ctranslate2 is not installed)")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "seconds": results}, indent=1))


if __name__ == "__main__":
    main()
