"""A trained model decoded by our decoder (float32 and bf16 weights) and by CTranslate2 (its
export, float32 and int8), as ``evaluate.py`` decodes: the same lines, options and batching
(``decode.max_tokens``), alternating system by system within each round (the order rotates).
Per system: sentences/s and target tokens/s (generated pieces plus eos; the median round), BLEU
(sacreBLEU, ``transformer.metrics``) and the share of lines identical to ours in float32.

    pip install -e ".[export]"
    python bench/bench_ct2.py "OUT/checkpoints/epochs/*.ckpt" --root ../shared/data/multi30k
    python bench/bench_ct2.py CKPT --root DIR --beam 1 --rounds 3 --threads 2 [--no-bf16]
    python bench/bench_ct2.py CKPT --root DIR --profile "ours float32"   # where its time goes

``--profile SYSTEM`` runs one more translation of one of our systems under ``torch.profiler`` and
prints the operators with the most time of their own.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import torch

from transformer.averaging import load_or_average
from transformer.checkpoints import model_from_checkpoint
from transformer.checkpoints import tokenizers_from_checkpoint as tokenizers
from transformer.decoding import DecodeOptions
from transformer.errors import one_line_errors
from transformer.export.ct2 import export_ct2, import_ctranslate2
from transformer.export.ct2_translate import CT2Translator
from transformer.metrics import score_translations
from transformer.translate import Translator


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path) as f:
        return f.read().splitlines()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("ckpt", nargs="+", help="checkpoints (several, or a quoted glob: averaged)")
    p.add_argument("--root", required=True, help="folder of the split's raw files")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--beam", type=int, default=5, help="1 = greedy")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2, help="torch and CTranslate2 threads")
    p.add_argument("--max-tokens", type=int, default=4096, help="evaluate.py's decode.max_tokens")
    p.add_argument(
        "--one-limit", action="store_true", help="also CTranslate2 in one call, one limit"
    )
    p.add_argument("--limit", type=int, help="the split's first N sentences only")
    p.add_argument("--no-bf16", action="store_true", help="no bf16 run of ours (CPUs without bf16)")
    p.add_argument("--profile", help="a system to profile after the rounds")
    p.add_argument("--sync-every", type=int, default=0, help="ours: decode.sync_every")
    args = p.parse_args()
    import_ctranslate2()
    torch.set_num_threads(args.threads)
    paths = sorted(f for pattern in args.ckpt for f in glob.glob(pattern)) or args.ckpt
    root = Path(args.root)
    lines = read(next(root.glob(f"{args.split}.{args.src}*")))
    refs = read(next(root.glob(f"{args.split}.{args.tgt}*")))
    lines, refs = lines[: args.limit], refs[: args.limit]
    strategy = "greedy" if args.beam == 1 else "beam"
    options = DecodeOptions(strategy=strategy, beam_size=args.beam, sync_every=args.sync_every)

    ckpt = load_or_average(paths)
    src_tok, tgt_tok = tokenizers(ckpt, paths[0])
    model = model_from_checkpoint(ckpt, paths[0])
    tmp = Path(tempfile.mkdtemp(prefix="bench_ct2."))
    export_ct2(paths, tmp / "float32")
    export_ct2(paths, tmp / "int8", quantization="int8")
    systems = {
        "ours float32": Translator(model, src_tok, tgt_tok),
        "ct2 float32": CT2Translator(tmp / "float32", threads=args.threads),
        "ct2 int8": CT2Translator(tmp / "int8", threads=args.threads),
    }
    if not args.no_bf16:
        bf16 = model_from_checkpoint(ckpt).to(torch.bfloat16)
        systems["ours bf16"] = Translator(bf16, src_tok, tgt_tok)
    if args.one_limit:  # CTranslate2 as most would call it: one call, one length limit
        for name in ("ct2 float32", "ct2 int8"):
            directory = tmp / name.split()[1]
            systems[f"{name}, one call"] = CT2Translator(
                directory, threads=args.threads, exact_limits=False
            )

    def run(name: str) -> tuple[float, list[str]]:
        start = time.perf_counter()
        out = systems[name].translate(lines, options, args.max_tokens)
        return time.perf_counter() - start, [t[0].text for t in out]

    for system in systems.values():  # warm-up
        system.translate(lines[:50], options, args.max_tokens)
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    hyps: dict[str, list[str]] = {}
    names = list(systems)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            took, out = run(name)
            seconds[name].append(took)
            if hyps.setdefault(name, out) != out:
                raise RuntimeError(f"{name}: round {r + 1} translated differently")

    print(f"{args.split}, {len(lines)} sentences, beam {args.beam}, {args.threads} threads, "
          f"{args.rounds} alternating rounds, checkpoints: {', '.join(paths)}")  # fmt: skip
    print("| system | sentences/s | target tokens/s | BLEU | identical to ours float32 | "
          "seconds per round |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name in systems:
        median = statistics.median(seconds[name])
        tokens = sum(len(tgt_tok.encode(h)) + 1 for h in hyps[name])
        bleu = score_translations(hyps[name], refs).bleu
        same = sum(a == b for a, b in zip(hyps[name], hyps["ours float32"], strict=True))
        rounds = " ".join(f"{s:.2f}" for s in seconds[name])
        print(f"| {name} | {len(lines) / median:.1f} | {tokens / median:.0f} | {bleu:.2f} | "
              f"{same}/{len(lines)} | {rounds} |")  # fmt: skip
    ratio = statistics.median(seconds["ours float32"]) / statistics.median(seconds["ct2 float32"])
    print(f"ours float32 / ct2 float32 time: {ratio:.2f}x")
    if args.profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            run(args.profile)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    with one_line_errors():  # a bad checkpoint or file: one line, as train.py's
        main()
