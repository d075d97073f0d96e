"""BLEU and decoding speed against the share of attention heads removed
(``python -m transformer.prune``), pruned for real and, for comparison, only masked.

Heads are ranked once (``--by``, on the first ``--sentences`` pairs of ``--split``), then for each
share the least important are removed (:func:`transformer.prune.least_important`) and the test
split is translated as ``evaluate.py`` does, by the pruned model and by the full model with the
same heads masked (the same translations, the unpruned cost). Times are the best of
``--repeat``; the masked and pruned hypotheses are checked to be identical.

    python bench/bench_prune.py OUT/checkpoints/last.ckpt --data-root ../shared/data/multi30k \\
        --shares 0 0.25 0.5 0.75 --by gradient --beam 5
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import torch

from transformer.analysis.heads import set_pruned
from transformer.checkpoints import load_checkpoint, model_from_checkpoint
from transformer.checkpoints import tokenizers_from_checkpoint as tokenizers
from transformer.data.datamodule import checkpoint_texts
from transformer.decoding import DecodeOptions
from transformer.errors import CheckpointError, one_line_errors
from transformer.metrics import score_translations
from transformer.prune import checkpoint_scores, least_important
from transformer.surgery import prune_model
from transformer.translate import Translator


def timed(translator: Translator, sources: list[str], options: DecodeOptions, repeat: int):
    """(best seconds, hypotheses) of ``repeat`` translations of ``sources``."""
    best, hypotheses = float("inf"), []
    for _ in range(repeat):
        start = time.perf_counter()
        hypotheses = [t[0].text for t in translator.translate(sources, options)]
        best = min(best, time.perf_counter() - start)
    return best, hypotheses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("ckpt")
    p.add_argument("--data-root", help="the corpus folder, where it moved since training")
    p.add_argument("--by", choices=["mask", "gradient"], default="gradient")
    p.add_argument("--split", default="val", help="where heads are ranked")
    p.add_argument("--sentences", type=int, default=200, help="ranked on the split's first N")
    p.add_argument("--test-split", default="test", help="where BLEU and speed are measured")
    p.add_argument("--test-sentences", type=int, default=None, help="its first N (default all)")
    p.add_argument("--shares", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75])
    p.add_argument("--beam", type=int, default=5, help="1 = greedy")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    ckpt = load_checkpoint(args.ckpt)
    given = {"root": args.data_root}
    scores = checkpoint_scores(ckpt, args.ckpt, args.by, args.split, args.sentences, given)
    data = checkpoint_texts(
        ckpt,
        {"root": args.data_root} if args.data_root else {},
        CheckpointError(f"{args.ckpt} records no data settings"),
        f"{args.ckpt}: its data settings are unusable here",
    )
    split = data.split_name(args.test_split)  # the name, for the report
    sources = data.sources(args.test_split)[: args.test_sentences]
    references = data.references(args.test_split)[: args.test_sentences]
    full = model_from_checkpoint(ckpt).eval()
    src_tok, tgt_tok = tokenizers(ckpt, args.ckpt)
    if prefix := data.source_prefix():  # a multilingual model's target token, as in training
        src_tok = src_tok.with_prefix(prefix)
    options = DecodeOptions(strategy="greedy" if args.beam == 1 else "beam", beam_size=args.beam)
    total = len(scores)
    print(f"checkpoint={args.ckpt} by={args.by} ranked on {args.split}[:{args.sentences}]; "
          f"{split}: {len(sources)} sentences, beam {args.beam}, {torch.get_num_threads()} "
          f"threads, best of {args.repeat}")  # fmt: skip
    print("| removed | heads left | parameters | BLEU | pruned s | masked s | speed-up | same |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for share in args.shares:
        heads = least_important(full, scores, share)
        pruned = prune_model(full, heads).eval()
        pruned_s, hyps = timed(Translator(pruned, src_tok, tgt_tok), sources, options, args.repeat)
        set_pruned(full, heads)
        masked_s, masked_hyps = timed(Translator(full, src_tok, tgt_tok), sources, options,
                                      args.repeat)  # fmt: skip
        full.clear_head_masks()
        bleu = score_translations(hyps, references).bleu
        print(f"| {share:.2f} | {total - len(heads)} | {pruned.num_parameters():,} | {bleu:.2f} "
              f"| {pruned_s:.2f} | {masked_s:.2f} | {masked_s / pruned_s:.2f}x "
              f"| {hyps == masked_hyps} |")  # fmt: skip


if __name__ == "__main__":
    with one_line_errors():  # a bad checkpoint or file: one line, as train.py's
        main()
