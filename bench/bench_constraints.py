"""Terminology constraints on a test set: how often the constrained beam search places them, its
BLEU, and its speed against the unconstrained search, in one process, rounds alternating.

The constraints come from the references, as in Post & Vilar (2018): per sentence up to
``--per-sentence`` reference words that the unconstrained translation lacks, the longest first
(ties: the earlier word). Words are the reference's whitespace-separated tokens without the
punctuation around them; a word is lacking when its lowercased form is none of the lowercased
words of the translation; words the target vocabulary cannot write (unknown pieces) are skipped.
A phrase is met when its text occurs in the translation, case-sensitive (evaluate.py's rule,
:func:`transformer.evaluation.terminology.constraints_met`).

    flock /work/locks/heavy python bench/bench_constraints.py CKPT \\
        --source ../shared/data/multi30k/test_2016_flickr.en.gz \\
        --reference ../shared/data/multi30k/test_2016_flickr.de.gz
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import string
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import torch

from transformer.checkpoints import (
    load_checkpoint,
    model_from_checkpoint,
    tokenizers_from_checkpoint,
)
from transformer.data.text_files import read_lines
from transformer.data.tokenizer import UNK_ID
from transformer.decoding import DecodeOptions
from transformer.decoding.step import Stepper
from transformer.errors import one_line_errors
from transformer.evaluation.terminology import constraints_met
from transformer.metrics import score_translations
from transformer.translate import Translation, Translator


def words(text: str) -> list[str]:
    return [w for w in (t.strip(string.punctuation + "„“”") for t in text.split()) if w]


def lacking_words(reference: str, translation: str, count: int, writable) -> list[str]:
    """Up to ``count`` words of ``reference`` that ``translation`` lacks (lowercased), longest
    first, then in order."""
    have = {w.lower() for w in words(translation)}
    seen, lacking = set(), []
    for w in words(reference):
        if w.lower() not in have and w not in seen and writable(w):
            seen.add(w)
            lacking.append(w)
    return sorted(lacking, key=lambda w: -len(w))[:count]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("ckpt")
    p.add_argument("--source", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--per-sentence", type=int, default=2, help="constraints per sentence, at most")
    p.add_argument("--rounds", type=int, default=2, help="timed rounds of each, alternating")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--lines", type=int, default=None, help="the first N sentences only")
    args = p.parse_args()

    ckpt = load_checkpoint(args.ckpt)
    model = model_from_checkpoint(ckpt, args.ckpt)
    translator = Translator(model, *tokenizers_from_checkpoint(ckpt, args.ckpt))
    sources = read_lines(args.source)[: args.lines]
    references = read_lines(args.reference)[: args.lines]
    options = DecodeOptions(beam_size=args.beam)
    translator.translate(sources[:50], options, args.max_tokens)  # warm-up

    def writable(word: str) -> bool:
        return UNK_ID not in translator.tgt_tokenizer.encode(word)

    rows = {"plain": 0, "constrained": 0}  # decoder rows run, all steps: the work, untimed
    log_probs = Stepper.log_probs

    def run(constraints: list[list[str]] | None) -> tuple[list[Translation], tuple[float, float]]:
        name = "plain" if constraints is None else "constrained"

        def counted(stepper: Stepper, prefixes: torch.Tensor) -> torch.Tensor:
            rows[name] += prefixes.size(0)
            return log_probs(stepper, prefixes)

        Stepper.log_probs, rows[name] = counted, 0
        start, cpu = time.perf_counter(), time.process_time()
        out = translator.translate(sources, options, args.max_tokens, constraints=constraints)
        seconds = time.perf_counter() - start, time.process_time() - cpu
        Stepper.log_probs = log_probs
        return [t[0] for t in out], seconds

    plain_out, seconds = run(None)
    plain = [t.text for t in plain_out]
    wanted = [
        lacking_words(r, h, args.per_sentence, writable)
        for r, h in zip(references, plain, strict=True)
    ]
    times = {"plain": [seconds], "constrained": []}  # (wall, CPU) seconds of each round
    for i in range(args.rounds):  # rounds alternate: plain (the first one above), constrained
        if i:
            times["plain"].append(run(None)[1])
        constrained_out, seconds = run(wanted)
        times["constrained"].append(seconds)
    constrained = [t.text for t in constrained_out]
    tok = translator.tgt_tokenizer
    met, total = constraints_met(constrained, wanted, tok)
    plain_met, _ = constraints_met(plain, wanted, tok)
    flagged = sum(t.constraints_met is False for t in constrained_out)
    n = len(sources)
    best = {name: min(wall for wall, _ in values) for name, values in times.items()}
    pairs = list(zip(times["plain"], times["constrained"], strict=True))
    ratio = {  # constrained / plain time, each round's, their median: the figure
        "wall": statistics.median(c[0] / p[0] for p, c in pairs),
        "cpu": statistics.median(c[1] / p[1] for p, c in pairs),
    }
    result = {
        "checkpoint": args.ckpt,
        "beam": args.beam,
        "sentences": n,
        "sentences_constrained": sum(1 for w in wanted if w),
        "phrases": total,
        "met_constrained": met,
        "met_plain": plain_met,
        "ends_unmet_at_length_limit": flagged,
        "bleu_plain": score_translations(plain, references).bleu,
        "bleu_constrained": score_translations(constrained, references).bleu,
        "sentences_per_s": {name: n / s for name, s in best.items()},
        "decoder_rows": rows,
        "times_wall_cpu": times,
        "time_ratio_median": ratio,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
    }
    print(json.dumps(result, indent=2))
    print(f"| search (beam {args.beam}) | phrases met | BLEU | sentences/s |")
    print("|---|---|---|---|")
    print(f"| unconstrained | {plain_met}/{total} ({100 * plain_met / total:.1f}%) | "
          f"{result['bleu_plain']:.2f} | {result['sentences_per_s']['plain']:.1f} |")  # fmt: skip
    print(f"| constrained | {met}/{total} ({100 * met / total:.1f}%) | "
          f"{result['bleu_constrained']:.2f} | "
          f"{result['sentences_per_s']['constrained']:.1f} "
          f"(fastest rounds: {best['constrained'] / best['plain']:.2f}x the time) |")  # fmt: skip
    print(f"median of the rounds' time ratios: {ratio['wall']:.2f}x (CPU time {ratio['cpu']:.2f}x)")
    print(f"decoder rows: constrained {rows['constrained'] / rows['plain']:.2f}x unconstrained")


if __name__ == "__main__":
    with one_line_errors():  # a bad checkpoint or file: one line, as train.py's
        main()
