"""Each quality-per-hour lever alone against the CPU recipe, at the same wall-clock budget.

    python bench/bench_levers.py --data ../shared/data/multi30k [--minutes 54] [--out DIR]
        [--levers recipe,fp32,invsqrt+fp32,...] [--dry-run]

Every lever trains ``experiment=multi30k_en_de_cpu`` with its overrides for ``--minutes``
(``trainer.max_time``; ``a+b``: levers a and b together, a candidate recipe), one run after the
other in its own process, then ``evaluate.py``'s scoring (beam 5) of two checkpoints of each run
on val and the three test sets: ``avg``, the recipe's average of the last 10 complete epochs,
and ``last``, the last checkpoint (the EMA run's average). The table (also ``table.md``; the
numbers in ``results.json``, under ``--out``) gives val/bleu (greedy, the recipe's 300 sentences,
last validation), BLEU / BLEU -lc / chrF per split (val: the one to choose by), the updates made
and the training wall time.
Runs must not share the machine: run it on a quiet one. ``--dry-run``: the tiny model on a
synthetic corpus (unless ``--data``), 5 seconds of training each, beam 2 (the command lines and
the table, checked in a minute).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TEST_SETS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
SCORED = ("val", *TEST_SETS)  # val to choose by (beam 5, the whole set); the test sets to report

# name -> overrides of the recipe; each lever alone (README, "Budgeted training").
LEVERS: dict[str, list[str]] = {
    "recipe": [],
    "invsqrt": ["optim=adamw"],  # invsqrt+fp32: the recipe before linear decay and bf16
    "fp32": ["trainer.precision=32-true"],
    "cosine": ["optim=adamw_cosine"],
    "linear": ["optim=adamw_linear"],  # the recipe's schedule before wsd (2026-11-24)
    "rdrop": ["loss.rdrop_alpha=5"],
    "ema": ["ema.decay=0.999"],
    "dropout0.3": ["model.dropout=0.3"],  # the recipe before 2026-11-24 (now 0.2)
    "dropout0.1": ["model.dropout=0.1"],
    "cooldown0.3": ["optim.scheduler.cooldown=0.3"],  # wsd's decay: the last 30% of the time
    "seed1": ["seed=1"],  # the recipe at another seed: how much a seed moves the scores
}


def overrides(name: str) -> list[str]:
    """A lever's overrides of the recipe; ``invsqrt+fp32`` joins levers (the earlier recipe)."""
    return [o for part in name.split("+") for o in LEVERS[part]]


DRY_TRAIN = ["model=tiny", "data.vocab_size=64", "data.num_workers=0", "data.max_tokens=512",
             "trainer.num_sanity_val_steps=0", "validation.bleu_sentences=8",
             "~callbacks.attention_maps"]  # fmt: skip


def max_time(seconds: float) -> str:
    """``trainer.max_time`` as DD:HH:MM:SS, whole seconds (at least one)."""
    total = max(1, round(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days:02d}:{hours:02d}:{minutes:02d}:{secs:02d}"


def train_command(lever: str, data: Path, run: Path, seconds: float, dry: bool) -> list[str]:
    return [
        sys.executable, str(REPO / "train.py"), "experiment=multi30k_en_de_cpu",
        f"data.root={data}", "logger=csv", f"hydra.run.dir={run}",
        f"trainer.max_time={max_time(seconds)}", "trainer.enable_progress_bar=false",
        *([*DRY_TRAIN, f"data.cache_dir={run.parent / 'cache'}"] if dry else []),
        *overrides(lever),
    ]  # fmt: skip


def checkpoints(run: Path) -> dict[str, str]:
    """The checkpoints scored: ``avg`` (the recipe's: last 10 complete epochs), ``last``."""
    found = {}
    if any((run / "checkpoints" / "epochs").glob("*.ckpt")):
        found["avg"] = str(run / "checkpoints" / "epochs" / "*.ckpt")
    if (run / "checkpoints" / "last.ckpt").is_file():
        found["last"] = str(run / "checkpoints" / "last.ckpt")
    return found


def score(ckpt: str, data: Path, split: str, out: Path, dry: bool) -> dict[str, Any]:
    """``evaluate.py ckpt_path=ckpt data.root=data split=split`` in this process: its metrics."""
    from hydra import compose, initialize_config_dir

    from transformer.evaluation import evaluate

    overrides = [f"ckpt_path='{ckpt}'", f"data.root={data}", f"split={split}",
                 f"paths.output_dir={out}", *(["decode.beam_size=2"] if dry else [])]  # fmt: skip
    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        return evaluate(compose("evaluate", overrides=overrides))


def last_logged(run: Path, key: str) -> float | None:
    values = []
    for path in sorted(run.glob("csv/version_*/metrics.csv")):
        with open(path, newline="") as f:
            values += [float(r[key]) for r in csv.DictReader(f) if r.get(key)]
    return values[-1] if values else None


def global_step(run: Path) -> int | None:
    import torch

    last = run / "checkpoints" / "last.ckpt"
    if not last.is_file():
        return None
    return torch.load(last, map_location="cpu", weights_only=True, mmap=True)["global_step"]


def run_lever(lever: str, data: Path, out: Path, seconds: float, dry: bool) -> dict[str, Any]:
    run = out / lever
    start = time.perf_counter()
    with open(out / f"{lever}.log", "w") as log:
        done = subprocess.run(train_command(lever, data, run, seconds, dry), cwd=REPO,
                              stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    result: dict[str, Any] = {
        "lever": lever, "overrides": overrides(lever), "returncode": done.returncode,
        "train_wall_s": round(time.perf_counter() - start, 1), "updates": global_step(run),
        "val_bleu": last_logged(run, "val/bleu"), "scores": {},
    }  # fmt: skip
    for name, ckpt in checkpoints(run).items():
        for split in SCORED:
            m = score(ckpt, data, split, run / f"eval_{name}_{split}", dry)
            result["scores"].setdefault(name, {})[split] = [m["bleu"], m["bleu_lc"], m["chrf"]]
    return result


def table(results: list[dict[str, Any]]) -> str:
    sets = " | ".join(f"{s} BLEU / -lc / chrF" for s in SCORED)
    lines = [f"| lever | ckpt | val/bleu greedy | {sets} | updates | train wall min |",
             "|" + "---|" * (5 + len(SCORED))]  # fmt: skip
    for r in results:
        val = "-" if r["val_bleu"] is None else f"{r['val_bleu']:.2f}"
        wall = f"{r['train_wall_s'] / 60:.1f}"
        updates = "-" if r["updates"] is None else r["updates"]
        for name, by_split in r["scores"].items() or [("-", {})]:
            cells = [" / ".join(f"{x:.2f}" for x in by_split[s]) if s in by_split else "-"
                     for s in SCORED]  # fmt: skip
            lines.append(f"| {r['lever']} | {name} | {val} | {' | '.join(cells)} | "
                         f"{updates} | {wall} |")  # fmt: skip
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="the Multi30k folder (data.root)")
    parser.add_argument("--minutes", type=float, default=54.0, help="training time per lever")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "levers")
    parser.add_argument(
        "--levers",
        default=",".join(LEVERS),
        help="comma-separated names; a+b trains levers a and b together",
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny model, synthetic corpus")
    args = parser.parse_args(argv)
    args.levers = args.levers.split(",")
    unknown = [x for name in args.levers for x in name.split("+") if x not in LEVERS]
    if unknown:
        parser.error(f"unknown lever(s) {', '.join(unknown)}; choose from {', '.join(LEVERS)}")
    if args.data is None and not args.dry_run:
        parser.error("--data DIR (the Multi30k folder) is needed, except with --dry-run")
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    seconds = 5.0 if args.dry_run else args.minutes * 60
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if args.dry_run and data is None:
            sys.path.insert(0, str(REPO))
            from bench.gpu_check import SPLITS
            from tests.tiny import write_corpus

            data = write_corpus(Path(tmp) / "corpus", SPLITS, suffix=".gz")
        results = [run_lever(lever, data, args.out, seconds, args.dry_run) for lever in args.levers]
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    text = table(results)
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    return results


if __name__ == "__main__":
    main()
