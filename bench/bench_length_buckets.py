"""BLEU of a checkpoint's translations by source length, and on sources longer than any it was
trained on: how a position encoding (``model.positions``) holds up as sentences grow.

    python bench/bench_length_buckets.py "OUT/checkpoints/epochs/*.ckpt" --data /path/to/multi30k
        [--sets test_2016_flickr,test_2017_flickr,test_2017_mscoco] [--beam 5]
        [--buckets 10,15,20,30] [--json FILE]

The checkpoint is read as ``evaluate.py``'s ``ckpt_path``: a path, or a glob pattern whose
matches are averaged (a run's last 10 epochs, the recipe's score). For each test set: BLEU and
BLEU -lc (sacreBLEU, as ``evaluate.py`` scores) of the sentences in each bucket of source length
in pieces (the model's positions; ``--buckets`` are the upper edges), then on **long** sources:
consecutive test pairs joined (sources with sources, references with references) until each
source has more pieces than the longest training source, within the model's ``max_positions``.
``long, apart`` scores the same joined references against the parts' own translations joined, so
that ``long`` minus ``apart`` is what translating the long source in one piece costs, the model's
quality aside; the length ratio (translation tokens / reference tokens) tells a translation that
stops after its first sentence from a wrong one.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import sacrebleu
import torch

from transformer.averaging import load_or_average
from transformer.checkpoints import (
    checkpoint_paths,
    model_from_checkpoint,
    tokenizers_from_checkpoint,
)
from transformer.decoding import DecodeOptions
from transformer.errors import one_line_errors
from transformer.translate import Translator

TEST_SETS = "test_2016_flickr,test_2017_flickr,test_2017_mscoco"


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def scores(hyps: list[str], refs: list[str]) -> dict[str, float]:
    """BLEU, BLEU -lc and the length ratio (translations' tokens / references')."""
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    return {
        "sentences": len(hyps),
        "bleu": round(bleu.score, 2),
        "bleu_lc": round(sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score, 2),
        "length_ratio": round(bleu.sys_len / max(1, bleu.ref_len), 3),
    }


def joined_groups(lengths: list[int], longer_than: int, limit: int) -> list[list[int]]:
    """Runs of consecutive indices whose lengths add up to more than ``longer_than`` and at most
    ``limit``; a run that would pass ``limit`` starts again from the sentence that would (a
    sentence longer than ``limit`` alone is left out)."""
    groups, run, total = [], [], 0
    for i, n in enumerate(lengths):
        if total + n > limit:
            run, total = [], 0
        if n > limit:  # alone too long: in no run
            continue
        run.append(i)
        total += n
        if total > longer_than:
            groups.append(run)
            run, total = [], 0
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt", help="a checkpoint, or a glob pattern of checkpoints to average")
    parser.add_argument("--data", required=True, help="directory of the Multi30k .gz files")
    parser.add_argument("--sets", default=TEST_SETS)
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--buckets", default="10,15,20,30", help="upper edges, in pieces")
    parser.add_argument("--json", help="write the numbers here too")
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    ckpt = load_or_average(checkpoint_paths(args.ckpt))
    src_tok, tgt_tok = tokenizers_from_checkpoint(ckpt, args.ckpt)
    model = model_from_checkpoint(ckpt, args.ckpt).eval()
    translator = Translator(model, src_tok, tgt_tok)
    strategy = "greedy" if args.beam == 1 else "beam"
    options = DecodeOptions(strategy=strategy, beam_size=args.beam)
    data = Path(args.data)

    def pieces(lines: list[str]) -> list[int]:  # the encoder's input: pieces and eos
        return [len(ids) + 1 for ids in src_tok.encode_batch(lines)]

    longest = max(pieces(read(data / f"train.{args.src}.gz")))
    edges = [int(e) for e in args.buckets.split(",")]
    names = [f"{lo + 1}-{hi}" for lo, hi in zip([0, *edges], edges, strict=False)]
    names.append(f"{edges[-1] + 1}+")
    results: dict = {
        "ckpt": args.ckpt,
        "positions": model.cfg.positions,
        "beam": args.beam,
        "longest_training_source": longest,
        "sets": {},
    }
    for name in args.sets.split(","):
        src, ref = read(data / f"{name}.{args.src}.gz"), read(data / f"{name}.{args.tgt}.gz")
        hyp = [t[0].text for t in translator.translate(src, options)]
        lengths = pieces(src)
        rows = {"all": scores(hyp, ref)}
        for k, bucket in enumerate(names):
            lo, hi = ([0, *edges][k], edges[k] if k < len(edges) else 10**9)
            keep = [i for i, n in enumerate(lengths) if lo < n <= hi]
            if keep:
                rows[bucket] = scores([hyp[i] for i in keep], [ref[i] for i in keep])
        groups = joined_groups([n - 1 for n in lengths], longest, model.cfg.max_positions - 1)
        joined = [" ".join(src[i] for i in g) for g in groups]
        fits = [longest < n <= model.cfg.max_positions for n in pieces(joined)]
        groups = [g for g, ok in zip(groups, fits, strict=True) if ok]
        long_src = [" ".join(src[i] for i in g) for g in groups]
        long_ref = [" ".join(ref[i] for i in g) for g in groups]
        long_hyp = [t[0].text for t in translator.translate(long_src, options)]
        rows["long"] = scores(long_hyp, long_ref)
        rows["long"]["mean_pieces"] = round(sum(pieces(long_src)) / max(1, len(groups)), 1)
        rows["long, apart"] = scores([" ".join(hyp[i] for i in g) for g in groups], long_ref)
        results["sets"][name] = rows

    print(f"positions={results['positions']}, beam {args.beam}; longest training source: "
          f"{longest} pieces (with eos)")  # fmt: skip
    print("| set | bucket (source pieces) | sentences | BLEU | BLEU -lc | length ratio |")
    print("|---|---|---:|---:|---:|---:|")
    for name, rows in results["sets"].items():
        for bucket, row in rows.items():
            label = f"{bucket} (mean {row['mean_pieces']})" if "mean_pieces" in row else bucket
            print(
                f"| {name} | {label} | {row['sentences']} | {row['bleu']} | {row['bleu_lc']} "
                f"| {row['length_ratio']} |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    with one_line_errors():  # a bad checkpoint or file: one line, as train.py's
        main()
