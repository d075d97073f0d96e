"""Throughput and latency of the translation server (``python -m transformer.serve``) under
concurrent clients: each ``--batch-lines`` value starts a server of its own (a process, as a user
runs it), ``--clients`` threads here each send ``--requests`` requests of ``--lines`` source lines
in turn, and the table gives lines/s over all of them and each request's latency (median, 95th
percentile), with whether the answers are the same at every setting (an md5 of the texts).
``--batch-lines 1`` decodes each request alone, as the server did before it batched.

    python bench/bench_serve.py OUT/checkpoints/last.ckpt \\
        --source ../shared/data/multi30k/test_2016_flickr.en.gz --batch-lines 1,64
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from transformer.data.text_files import read_lines


def start(args: argparse.Namespace, batch_lines: int) -> tuple[subprocess.Popen, str]:
    """A server of the checkpoint on a free port, and its address once it listens."""
    command = [sys.executable, "-m", "transformer.serve", *args.checkpoints, "--port", "0",
               "--device", args.device, "--batch-lines", str(batch_lines),
               "--decode", json.dumps({"beam_size": args.beam})]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    said = []
    for line in process.stderr:
        if found := re.search(r"on (http://[\d.]+:\d+)", line):
            return process, found.group(1)
        said.append(line)
    process.wait()
    sys.stderr.write("".join(said))  # the server's error (a checkpoint it cannot read, ...)
    sys.exit(1)


def post(url: str, lines: list[str]) -> tuple[float, list[str]]:
    """Seconds to the answer, and its first translation of each line."""
    data = json.dumps({"text": lines}).encode()
    start = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url + "/translate", data), timeout=600) as r:
        answer = json.load(r)
    return time.perf_counter() - start, [s[0]["text"] for s in answer["translations"]]


def run(args: argparse.Namespace, sources: list[str], batch_lines: int) -> dict[str, float | str]:
    process, url = start(args, batch_lines)
    try:
        post(url, sources[: args.lines])  # warm-up, not timed

        def client(c: int) -> list[tuple[float, list[str]]]:
            out = []
            for r in range(args.requests):
                first = (c * args.requests + r) * args.lines
                out.append(post(url, sources[first : first + args.lines]))
            return out

        start_time = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            answers = [a for sent in pool.map(client, range(args.clients)) for a in sent]
        seconds = time.perf_counter() - start_time
    finally:
        process.terminate()
        process.wait(timeout=60)
    latencies = sorted(s for s, _ in answers)
    texts = "\n".join(t for _, lines in answers for t in lines)
    return {
        "batch_lines": batch_lines,
        "lines_per_s": args.clients * args.requests * args.lines / seconds,
        "p50_s": statistics.median(latencies),
        "p95_s": latencies[round(0.95 * (len(latencies) - 1))],
        "md5": hashlib.md5(texts.encode()).hexdigest()[:8],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="as the server takes them (averaged)")
    parser.add_argument("--source", required=True, help="source sentences, a line each (.gz too)")
    parser.add_argument("--batch-lines", default="1,64", help="the settings compared, e.g. 1,16,64")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--requests", type=int, default=16, help="requests a client sends")
    parser.add_argument("--lines", type=int, default=1, help="source lines a request")
    parser.add_argument("--beam", type=int, default=5, help="the server's beam (default 5)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    args = parser.parse_args()
    sources = read_lines(args.source)
    needed = args.clients * args.requests * args.lines
    if len(sources) < needed:
        raise SystemExit(f"{args.source} has {len(sources)} lines; the clients send {needed}")
    rows = [run(args, sources, int(b)) for b in args.batch_lines.split(",")]
    print(f"{args.clients} clients x {args.requests} requests x {args.lines} lines, beam "
          f"{args.beam}, {Path(args.checkpoints[0]).name}")  # fmt: skip
    print("| --batch-lines | lines/s | latency p50 (s) | p95 (s) | answers (md5) |")
    print("|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['batch_lines']} | {r['lines_per_s']:.1f} | {r['p50_s']:.3f} | "
              f"{r['p95_s']:.3f} | {r['md5']} |")  # fmt: skip


if __name__ == "__main__":
    main()
