"""The data pipeline at WMT sizes: a synthetic parallel corpus of N pairs, then SentencePiece
training, tokenization into the cache, the token-budget sampler's set-up and the first batch
(cold), a rerun from the cache to the first batch, and the memory a training loader holds.

The corpus is a Zipfian word model, deterministic per seed: 50,000 made-up words per language
(letters, lengths 2-12), sentence lengths log-normal around 22 words (WMT14 en-de's median is
about 21), the target a word-by-word image of the source through a fixed permutation with a
length change of up to a quarter, sentences capitalised and ending in a full stop.

    python bench/bench_data_scale.py --pairs 300000 1000000 4500000 --dir /tmp/scale

Each measurement runs in a fresh process (peak RSS is the largest of the process's own and its
loader workers'). Resident memory after the batches is given whole (VmRSS) and split into the
process's own (RssAnon) and pages of mapped files (RssFile: the memory-mapped token cache, shared
between processes and reclaimable). Speed figures go to docs/benchmarks.md ("Data pipeline at WMT
sizes").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout

import numpy as np

from transformer.data.tokenizer_training import SPM_TRAIN_SENTENCES

VOCAB_WORDS = 50_000


def words(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` distinct made-up lower-case words."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    out: set[str] = set()
    while len(out) < n:
        lengths = rng.integers(2, 13, n)
        chars = rng.choice(letters, size=int(lengths.sum()))
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        out.update("".join(chars[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True))
    return np.array(sorted(out)[:n], dtype=object)


def write_corpus(root: Path, pairs: int, seed: int = 0, chunk: int = 250_000) -> None:
    """``train.{en,de}`` of ``pairs`` lines and ``val``/``test`` of 3,000 each in ``root``."""
    rng = np.random.default_rng(seed)
    vocab_en, vocab_de = words(rng, VOCAB_WORDS), words(rng, VOCAB_WORDS)
    to_de = rng.permutation(VOCAB_WORDS)
    zipf = 1.0 / np.arange(1, VOCAB_WORDS + 1) ** 1.1
    cdf = np.cumsum(zipf / zipf.sum())
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", pairs), ("val", 3000), ("test", 3000)):
        with open(root / f"{split}.en", "w") as en, open(root / f"{split}.de", "w") as de:
            for start in range(0, n, chunk):
                m = min(chunk, n - start)
                src_len = np.clip(rng.lognormal(np.log(22), 0.55, m), 1, 150).astype(int)
                tgt_len = np.maximum(1, (src_len * rng.uniform(0.8, 1.25, m)).astype(int))
                ids = np.searchsorted(cdf, rng.random(int(src_len.sum())))  # Zipfian ranks
                bounds = np.concatenate([[0], np.cumsum(src_len)])
                for k in range(m):
                    s = ids[bounds[k] : bounds[k + 1]]
                    t = to_de[np.resize(s, tgt_len[k])]  # cycled or cut to the target length
                    en.write(" ".join(vocab_en[s]).capitalize() + ".\n")
                    de.write(" ".join(vocab_de[t]).capitalize() + ".\n")


def peak_rss_mb() -> float:
    """Peak resident memory of this process and of its finished children (Linux: KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024


def rss_mb(pid: int, kind: str = "VmRSS") -> float:
    """Resident memory of a process: ``VmRSS`` all of it, ``RssAnon`` its own (heap, arrays),
    ``RssFile`` pages of mapped files (the token cache: shared, the kernel's to reclaim)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(kind + ":")) / 1024


def measure(
    root: str, cache: str, vocab: int, workers: int, batches: int, spm_sentences: int
) -> dict:
    """One process: build (or load) the data module, then draw ``batches`` training batches."""
    from transformer.data import datamodule as dm_module
    from transformer.data import prepare

    times: dict[str, float] = {}

    def timed(name, fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times[name] = times.get(name, 0.0) + time.perf_counter() - start

        return run

    prepare.train_tokenizer = timed("spm_train", prepare.train_tokenizer)
    prepare.build_split = timed("tokenize_and_save", prepare.build_split)
    start = time.perf_counter()
    dm = dm_module.TranslationDataModule(
        source="local", root=root, vocab_size=vocab, max_tokens=8192, max_len=256,
        num_workers=workers, cache_dir=cache, spm_train_sentences=spm_sentences,
    )  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    times["prepare_total"] = time.perf_counter() - start
    t = time.perf_counter()
    loader = dm.train_dataloader()
    times["sampler_setup"] = time.perf_counter() - t
    t = time.perf_counter()
    it = iter(loader)
    next(it)
    times["first_batch"] = time.perf_counter() - t
    times["to_first_batch"] = time.perf_counter() - start
    for _ in range(batches - 1):
        next(it)
    worker_pids = [w.pid for w in getattr(it, "_workers", [])]
    rss = {
        f"{who}_{kind}_mb": [round(rss_mb(p, kind)) for p in pids]
        for who, pids in (("main", [os.getpid()]), ("worker", worker_pids))
        for kind in ("VmRSS", "RssAnon", "RssFile")
    }
    return {
        "pairs": len(dm.split("train")),
        **{k: round(v, 2) for k, v in times.items()},
        **rss,
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[300_000])
    parser.add_argument("--dir", default="/tmp/scale", help="corpora and caches go here")
    parser.add_argument("--vocab-size", type=int, default=32_000)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=200, help="drawn before RSS is read")
    parser.add_argument("--spm-train-sentences", type=int, default=SPM_TRAIN_SENTENCES)
    parser.add_argument("--measure", nargs=2, metavar=("ROOT", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:  # the child process
        result = measure(
            *args.measure, args.vocab_size, args.num_workers, args.batches,
            args.spm_train_sentences,
        )  # fmt: skip
        print(json.dumps(result))
        return
    rows = []
    for n in args.pairs:
        root, cache = Path(args.dir) / f"corpus{n}", Path(args.dir) / f"cache{n}"
        if not (root / "train.de").exists():
            start = time.perf_counter()
            write_corpus(root, n)
            print(f"# {n} pairs generated in {time.perf_counter() - start:.0f} s", flush=True)
        for run in ("cold", "cached"):
            if run == "cold" and cache.exists():
                subprocess.run(["rm", "-rf", str(cache)], check=True)
            cmd = [sys.executable, __file__, "--measure", str(root), str(cache)]
            cmd += ["--vocab-size", str(args.vocab_size), "--num-workers", str(args.num_workers)]
            cmd += ["--batches", str(args.batches)]
            cmd += ["--spm-train-sentences", str(args.spm_train_sentences)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            row = {"run": run, **json.loads(out.strip().splitlines()[-1])}
            print(json.dumps(row), flush=True)
            rows.append(row)


if __name__ == "__main__":
    main()
