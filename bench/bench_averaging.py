"""Which epochs to average: a run's epoch checkpoints averaged over windows of several widths,
each scored with beam search on val and the test sets.

    python bench/bench_averaging.py OUT [OUT ...] --data /path/to/multi30k
        [--sets val,test_2016_flickr,test_2017_flickr,test_2017_mscoco] [--beam 5]
        [--epochs 1,5,10,15,20] [--shares 0.1,0.2,0.3,0.5] [--json FILE]

Each ``OUT`` is a run directory of ``train.py`` that kept its epoch checkpoints
(``callbacks.epoch_checkpoints.save_top_k=-1`` keeps them all; the recipes keep 10). The windows:
``last``, the run's ``checkpoints/last.ckpt`` (its final weights, where the schedule ends at 0);
``N epochs``, the last N complete epochs (the recipes average 10); ``P of training``, the
epochs that ended in the last share P of the run's updates (0.2: about the decay phase of the
warmup-stable-decay recipes, which decay over the last 20% of their budget). Windows holding the
same epochs are scored once. Scores are sacreBLEU's BLEU -lc of detokenized output against the
one reference, as ``evaluate.py`` prints them (same decoding options, whole sets); the last
column is the mean over the test sets. With several runs, a last table gives each window's mean
over the runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import sacrebleu
import torch

from bench.bench_length_buckets import read  # a Multi30k .gz file's lines
from transformer.averaging import load_or_average
from transformer.checkpoints import (
    load_checkpoint,
    model_from_checkpoint,
    tokenizers_from_checkpoint,
)
from transformer.decoding import DecodeOptions
from transformer.errors import UserError, one_line_errors
from transformer.translate import Translator

SETS = "val,test_2016_flickr,test_2017_flickr,test_2017_mscoco"


def epoch_checkpoints(run: Path) -> list[tuple[int, Path]]:
    """The run's epoch checkpoints as (update count at the epoch's end, path), oldest first."""
    paths = run.glob("checkpoints/epochs/*.ckpt")
    found = [(int(load_checkpoint(p, mmap=True)["global_step"]), p) for p in paths]
    if not found:
        raise UserError(
            f"{run}/checkpoints/epochs holds no epoch checkpoints: train with the recipes' "
            "callbacks.epoch_checkpoints (save_top_k=-1 keeps every epoch)"
        )
    return sorted(found)


def windows(run: Path, epochs: list[int], shares: list[float]) -> dict[str, list[Path]]:
    """Each window's name and the checkpoints it averages; windows of the same epochs merged."""
    ckpts = epoch_checkpoints(run)
    last = run / "checkpoints" / "last.ckpt"
    total = int(load_checkpoint(last, mmap=True)["global_step"])
    named: dict[str, list[Path]] = {"last": [last]}
    for n in epochs:
        if n <= len(ckpts):
            named[f"{n} epochs"] = [p for _, p in ckpts[-n:]]
    for share in shares:
        picked = [p for step, p in ckpts if step > (1 - share) * total]
        if picked:
            named[f"{share:g} of training"] = picked
    merged: dict[str, list[Path]] = {}
    for name, paths in named.items():
        same = next((k for k, v in merged.items() if v == paths), None)
        if same is None:
            merged[name] = paths
        else:
            merged[f"{same} = {name}"] = merged.pop(same)
    return merged


def score_window(
    paths: list[Path], data: Path, sets: list[str], options: DecodeOptions, src: str, tgt: str
) -> dict[str, float]:
    ckpt = load_or_average([str(p) for p in paths])
    src_tok, tgt_tok = tokenizers_from_checkpoint(ckpt, str(paths[0]))
    translator = Translator(model_from_checkpoint(ckpt, str(paths[0])).eval(), src_tok, tgt_tok)
    scores = {}
    for name in sets:
        sources, refs = read(data / f"{name}.{src}.gz"), read(data / f"{name}.{tgt}.gz")
        hyps = [t[0].text for t in translator.translate(sources, options)]
        scores[name] = round(sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score, 2)
    return scores


def table(rows: dict[str, dict[str, float]], sets: list[str]) -> str:
    tests = [s for s in sets if s != "val"]
    lines = [
        "| window | epochs | " + " | ".join(sets) + " | test mean |",
        "|---|---:|" + "---:|" * (len(sets) + 1),
    ]
    for name, row in rows.items():
        mean = sum(row[s] for s in tests) / max(1, len(tests))
        cells = " | ".join(f"{row[s]:.2f}" for s in sets)
        lines.append(f"| {name} | {row['epochs']:g} | {cells} | {mean:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of train.py")
    parser.add_argument("--data", required=True, type=Path, help="the Multi30k .gz files")
    parser.add_argument("--sets", default=SETS)
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--epochs", default="1,5,10,15,20", help="last N complete epochs")
    parser.add_argument("--shares", default="0.1,0.2,0.3,0.5", help="last share of the updates")
    parser.add_argument("--json", type=Path, help="write the numbers here too")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    sets = args.sets.split(",")
    options = DecodeOptions(strategy="greedy" if args.beam == 1 else "beam", beam_size=args.beam)
    epochs = [int(n) for n in args.epochs.split(",")]
    shares = [float(s) for s in args.shares.split(",")]

    results: dict[str, dict[str, dict[str, float]]] = {}
    for run in args.runs:
        rows = {}
        for name, paths in windows(run, epochs, shares).items():
            rows[name] = {"epochs": len(paths) if paths[0].name != "last.ckpt" else 0}
            rows[name].update(score_window(paths, args.data, sets, options, args.src, args.tgt))
        results[str(run)] = rows
        print(f"\n{run} (BLEU -lc, beam {args.beam}; epochs 0: last.ckpt)\n{table(rows, sets)}")
        if args.json:  # after each run: a long sweep keeps what it scored
            args.json.write_text(json.dumps(results, indent=2) + "\n")
    if len(results) > 1:  # each window's mean over the runs that have it, by each of its names
        sums: dict[str, dict[str, float]] = {}
        counts: dict[str, int] = {}
        for rows in results.values():
            for name, row in rows.items():
                for alias in name.split(" = "):
                    counts[alias] = counts.get(alias, 0) + 1
                    total = sums.setdefault(alias, dict.fromkeys(row, 0.0))
                    for k, v in row.items():
                        total[k] += v
        means = {
            (f"{a} ({counts[a]} runs)" if counts[a] < len(results) else a): {
                k: v / counts[a] for k, v in total.items()
            }
            for a, total in sums.items()
        }
        print(f"\nmean of {len(results)} runs\n{table(means, sets)}")


if __name__ == "__main__":
    with one_line_errors():  # a bad run directory or checkpoint: one line, as train.py's
        main()
