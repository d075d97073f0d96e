"""Peak memory of translating a file: ``evaluate.py input=FILE output=OUT`` on files of N lines.

Each file cycles the lines of ``--source`` up to N lines. Each ``--code DIR`` is a checkout of
this repository whose ``evaluate.py`` runs (from its root, so its own ``transformer`` is imported)
once per N, in a child process of its own with ``--threads`` OpenMP threads (1); the table gives
the child's peak RSS (its ``ru_maxrss``, as ``/usr/bin/time -v`` reports it), its peak so far
each time a chunk of ``input_chunk`` lines was written (its ``VmHWM``, polled: one run of N lines
shows the growth from chunk to chunk), its wall time (model loading included) and lines/s. Every
run must translate every line: the output's line count is checked against N (so ``decode.nbest``
stays 1). Arguments after ``--`` are passed to ``evaluate.py`` (Hydra overrides).

    python bench/bench_memory.py OUT/checkpoints/last.ckpt --lines 1000,10000,100000
    git worktree add --detach /tmp/old COMMIT   # then, old against new:
    python bench/bench_memory.py CKPT --code /tmp/old --code . --decode greedy \\
        -- decode.max_len_a=0 decode.max_len_b=30
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_lines(source: str, n: int, path: Path) -> None:
    """``path``: the lines of ``source`` cycled to ``n`` lines."""
    opener = gzip.open if source.endswith(".gz") else open
    with opener(source, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in itertools.islice(itertools.cycle(lines), n))


def peak_rss(pid: int) -> float | None:
    """Process ``pid``'s peak RSS so far (MB, its ``VmHWM``); None once it has ended."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


def run(code: Path, cmd: list[str], env: dict[str, str], out: Path) -> tuple[float, float, list]:
    """Run ``cmd`` in ``code``; its peak RSS (MB), wall seconds, and its peak RSS each time
    ``out`` had grown (a chunk written: ``evaluate.py`` writes a chunk's lines at once)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=subprocess.DEVNULL)
    chunks, size = [], 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        grown = out.exists() and out.stat().st_size > size
        rss = peak_rss(proc.pid) if grown else None
        if rss is not None:
            size = out.stat().st_size
            chunks.append(rss)
        time.sleep(0.2)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} (in {code}) exited {proc.returncode}")
    return usage.ru_maxrss / 1024, seconds, chunks  # Linux: kilobytes


def label(code: Path) -> str:
    """``code``'s folder name and commit (``-dirty`` with changes not committed), else its path."""
    done = subprocess.run(["git", "-C", str(code), "describe", "--always", "--dirty"],
                          capture_output=True, text=True)  # fmt: skip
    commit = done.stdout.strip()
    return f"{code.name} {commit}" if commit else str(code)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("ckpt")
    p.add_argument("--lines", default="1000,10000,100000", help="comma-separated line counts")
    p.add_argument("--source", default="../shared/data/multi30k/test_2016_flickr.en.gz",
                   help="one sentence a line (.gz read as gzip), cycled")  # fmt: skip
    p.add_argument("--code", action="append", help="checkout to run (default: this one)")
    p.add_argument("--decode", choices=["beam", "greedy"], default="beam")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run")
    p.add_argument("--work", help="folder for the inputs and outputs (default: a temporary one)")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, overrides = p.parse_args(argv[:cut]), argv[cut + 1 :]  # after --: evaluate.py's

    codes = [Path(c).resolve() for c in args.code or [REPO]]
    counts = [int(n) for n in args.lines.split(",")]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), WANDB_MODE="offline")
    env.pop("PYTHONPATH", None)  # each checkout imports its own transformer, from its root
    for code in codes:  # the package each checkout's evaluate.py imports is its own
        imports = "import transformer; print(transformer.__file__)"
        done = subprocess.run([sys.executable, "-c", imports], cwd=code, env=env,
                              capture_output=True, text=True, check=True)  # fmt: skip
        where = done.stdout.strip()
        if Path(where).parents[1] != code:
            sys.exit(f"error: {code}'s evaluate.py would import {where}")
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        ckpt, source = Path(args.ckpt).resolve(), str(Path(args.source).resolve())
        rows = []
        for j, n in enumerate(counts):
            src = work / f"in{j}.txt"
            write_lines(source, n, src)
            for i, code in enumerate(codes):
                out, run_dir = work / f"out{j}_{i}.txt", work / f"run{j}_{i}"
                cmd = [sys.executable, "evaluate.py", f"ckpt_path={ckpt}", f"input={src}",
                       f"output={out}", f"decode={args.decode}", f"hydra.run.dir={run_dir}",
                       *overrides]  # fmt: skip
                rss, seconds, chunks = run(code, cmd, env, out)
                with open(out, "rb") as f:
                    written = sum(1 for _ in f)
                if written != n:
                    sys.exit(f"error: {code} wrote {written} lines for {n}")
                rows.append((code, n, rss, seconds, chunks))
                out.unlink()
    print(f"decode={args.decode} {' '.join(overrides)} OMP_NUM_THREADS={args.threads} "
          f"checkpoint={args.ckpt} source={args.source}")  # fmt: skip
    print("| code | lines | peak RSS (MB) | after each chunk | wall seconds | lines/s |")
    print("|---|---|---|---|---|---|")
    for code, n, rss, seconds, chunks in rows:
        after = " / ".join(f"{x:.0f}" for x in chunks)
        print(f"| {label(code)} | {n} | {rss:.0f} | {after} | {seconds:.1f} | {n / seconds:.1f} |")


if __name__ == "__main__":
    main()
