"""Translation speed of a trained checkpoint: sentences/s of ``Translator.translate`` (tokenize,
batch by length, decode, detokenize) on a file of source sentences, as ``evaluate.py`` runs it.

Each ``--code DIR`` is a checkout of this repository whose ``transformer`` package is timed (in its
own process); several are run in turn, ``--repeat`` times, and the table gives the best time of each
and whether their translations are identical (an md5 of the output). The first translation of the
first 50 lines is a warm-up, not timed. ``--prefixes FILE`` (line-aligned with the source) gives
each translation its start (:mod:`transformer.decoding.prefix`); ``--max-tokens 1`` translates
each line alone, as the server's single requests come.

    python bench/bench_translate.py OUT/checkpoints/last.ckpt \\
        --source ../shared/data/multi30k/test_2016_flickr.en.gz
    git worktree add /tmp/old COMMIT   # then, old against new:
    python bench/bench_translate.py CKPT --source FILE --code /tmp/old --code . --beam 1
    zcat test_2016_flickr.de.gz | awk '{NF = int(NF / 2)} 1' > half.de   # the references' halves
    python bench/bench_translate.py CKPT --source FILE --prefixes half.de --max-tokens 1
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path


def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(args.code[-1]).resolve()))
    import torch

    from transformer.checkpoints import (
        load_checkpoint,
        model_from_checkpoint,
        tokenizers_from_checkpoint,
    )
    from transformer.translate import Translator

    try:  # checkouts before the one options type kept DecodeOptions in transformer.translate
        from transformer.decoding import DecodeOptions

        strategy = {"strategy": "greedy" if args.beam == 1 else "beam"}
    except ImportError:
        from transformer.translate import DecodeOptions

        strategy = {}  # beam_size=1 alone meant greedy
    ckpt = load_checkpoint(args.ckpt)
    src_tok, tgt_tok = tokenizers_from_checkpoint(ckpt, args.ckpt)
    model = model_from_checkpoint(ckpt).to(getattr(torch, args.dtype))
    translator = Translator(model, src_tok, tgt_tok)
    lines = read(args.source)
    prefixes = read(args.prefixes) if args.prefixes else None
    if prefixes is not None and len(prefixes) != len(lines):
        sys.exit(f"--prefixes {args.prefixes}: {len(prefixes)} lines for {len(lines)} sources")
    options = DecodeOptions(**strategy, beam_size=args.beam)
    # prefixes only when given: an older timed checkout may lack the argument
    warm, forced = ({"prefixes": prefixes[:50]}, {"prefixes": prefixes}) if prefixes else ({}, {})
    translator.translate(lines[:50], options, max_tokens=args.max_tokens, **warm)
    start = time.perf_counter()
    out = translator.translate(lines, options, max_tokens=args.max_tokens, **forced)
    seconds = time.perf_counter() - start
    text = "\n".join(t[0].text for t in out)
    md5 = hashlib.md5(text.encode()).hexdigest()
    print(json.dumps({"seconds": seconds, "sentences": len(lines), "md5": md5}))


def read(path: str) -> list[str]:
    """The lines of a text file, gzip by its .gz (the timed checkout may predate read_lines)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("ckpt")
    p.add_argument("--source", required=True, help="one sentence a line (.gz read as gzip)")
    p.add_argument("--beam", type=int, default=5, help="1 = greedy")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="the weights' type (evaluate.py's dtype=)")  # fmt: skip
    p.add_argument("--prefixes", help="each translation's start, a line for each source line")
    p.add_argument("--max-tokens", type=int, default=4096,
                   help="source tokens a batch (1: each line alone)")  # fmt: skip
    p.add_argument("--code", action="append", help="checkout to time (default: this one)")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    here = str(Path(__file__).resolve().parents[1])
    sys.path.insert(0, here)
    from transformer.checkpoints import load_checkpoint
    from transformer.errors import one_line_errors

    with one_line_errors():  # a bad checkpoint: one line, as train.py's, before any child runs
        load_checkpoint(args.ckpt)
    codes = args.code or [here]
    runs: dict[str, list[dict]] = {code: [] for code in codes}
    for _ in range(args.repeat):
        for code in codes:
            cmd = [sys.executable, __file__, args.ckpt, "--source", args.source, "--child"]
            cmd += ["--beam", str(args.beam), "--dtype", args.dtype, "--code", code]
            cmd += ["--max-tokens", str(args.max_tokens)]
            cmd += ["--prefixes", args.prefixes] if args.prefixes else []
            done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
            if done.returncode:  # the child said why, on stderr
                sys.exit(done.returncode)
            runs[code].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"beam={args.beam} dtype={args.dtype} source={args.source} checkpoint={args.ckpt} "
          f"prefixes={args.prefixes} max_tokens={args.max_tokens}")  # fmt: skip
    print("| code | best seconds | sentences/s | output md5 |")
    print("|---|---|---|---|")
    for code, results in runs.items():
        best = min(r["seconds"] for r in results)
        md5s = {r["md5"] for r in results}
        print(f"| {code} | {best:.2f} | {results[0]['sentences'] / best:.1f} | {' '.join(md5s)} |")


if __name__ == "__main__":
    main()
