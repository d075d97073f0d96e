"""Each quality-per-hour lever alone against the CPU recipe, at the same wall-clock budget.

    python dev/bench_levers.py --data ../shared/data/multi30k [--minutes 54] [--out DIR]
        [--levers recipe,fp32,invsqrt+fp32,...] [--dry-run]
    python dev/bench_levers.py --gpu --data data/multi30k [--steps 12000] [--parallel 4]
        [--deadline SECONDS] [--out DIR] [--levers recipe,invsqrt,...] [--ensemble] [--dry-run]

Every lever trains ``experiment=multi30k_en_de_cpu`` with its overrides for ``--minutes``
(``trainer.max_time``; ``a+b``: levers a and b together, a candidate recipe), one run after the
other in its own process, then ``evaluate.py``'s scoring (beam 5) of two checkpoints of each run
on val and the three test sets: ``avg``, the recipe's average of the last 10 complete epochs,
and ``last``, the last checkpoint (the EMA run's average). The table (also ``table.md``; the
numbers in ``results.json``, under ``--out``) gives val/bleu (greedy, the recipe's 300 sentences,
last validation), BLEU / BLEU -lc / chrF per split (val: the one to choose by), the updates made
and the training wall time.
A lever whose run under ``--out`` has already finished is not trained or scored again (its
``bench.json`` and ``scores.json``). Runs must not share the machine: run it on a quiet one.
``--dry-run``: the tiny model on a synthetic corpus (unless ``--data``), 5 seconds of training
each, beam 2 (the command lines and the table, checked in a minute).

``--gpu``: the GPU levers against the GPU recipe ``experiment=multi30k_en_de``, at an equal number
of updates (``--steps``: ``trainer.max_steps``, the recipe's 12,000 unless given), so that
``--parallel`` runs can share one GPU without changing what they learn (their wall times are
then shared ones). The attention maps are off and val/bleu (monitoring only) is on 300
sentences: both cost time, not quality. ``--deadline``: after so many seconds the runs still
training get SIGTERM, write ``last.ckpt`` and stop unscored; the same command again (same
``--out``) resumes them, and scores each run once it has all its updates.

``--ensemble``: once every lever named has finished, their runs are also decoded together as one
ensemble (``evaluate.py ensemble=true``) and scored like a lever, a row for each checkpoint all
of them have: ``avg``, each run's last 10 epochs averaged into its ``avg10.ckpt``, and ``last``.
``--gpu --parallel 4 --levers recipe,seed1,seed2,seed3 --ensemble``: four models trained side by
side on one GPU, against any one of them alone (``ensemble.json`` keeps the scores with the
members' update counts).
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TEST_SETS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
SCORED = ("val", *TEST_SETS)  # val to choose by (beam 5, the whole set); the test sets to report

# dropout on the attention weights and on the FFN's hidden activations (the recipes: none)
ATTNDROP = ["model.attention_dropout=0.1", "model.activation_dropout=0.1"]

# The research features of 2026-11-26, levers of both recipes: subword regularisation
# (docs/data.md) and position encodings (docs/experiments/positions.md; below, for each recipe).
RESEARCH_LEVERS: dict[str, list[str]] = {
    # subword regularisation (docs/data.md): Kudo (2018)'s small-corpus setting, the 64 best
    # segmentations at alpha 0.1; on Multi30k 1.1x the pieces (the whole lattice at 0.1: 1.9-2x),
    # so the hour is not spent on much longer sequences, but its n-best search costs the loader a
    # fifth to half of a core (docs/benchmarks.md, "Subword sampling in the loader")
    "spm_sampling": ["data.spm_sampling.alpha=0.1", "data.spm_sampling.nbest=64"],
    # the whole lattice at Kudo's alpha 0.2: 1.3x the pieces, under a tenth of a core
    "spm_lattice": ["data.spm_sampling.alpha=0.2"],
    # BPE-dropout (Provilkov et al. 2020, p=0.1) against a BPE vocabulary of the recipe's size
    "bpe": ["data.spm_model_type=bpe"],
    "bpe_dropout": ["data.spm_model_type=bpe", "data.spm_sampling.alpha=0.1"],
    # position encodings
    "learned": ["model.positions=learned"],
    "relative": ["model.positions=relative"],
    "alibi": ["model.positions=alibi"],
}

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
    "seed2": ["seed=2"],  # a third seed of the recipe
    "attndrop0.1": ATTNDROP,
    "ls0.2": ["loss.label_smoothing=0.2"],
    "vocab4k": ["data.vocab_size=4000"],  # a smaller joint vocabulary (the recipe: 6000)
    "vocab8k": ["data.vocab_size=8000"],
    # the model's size (the recipe: model=mini, 4+4 layers, d_model 128, FFN 256); each makes fewer
    # updates in the hour
    "layers6": ["model.num_encoder_layers=6", "model.num_decoder_layers=6"],  # deeper: 6+6
    "dmodel192": ["model.d_model=192", "model.d_ff=384"],  # wider: 1.5x, 48 dimensions a head
    # the peak learning rate (the recipe: 5e-3, held for wsd's first 80% of the time), halved and
    # doubled
    "lr2.5e-3": ["optim.optimizer.lr=2.5e-3"],
    "lr1e-2": ["optim.optimizer.lr=1.0e-2"],
    # half the recipe's 4096-token batches: twice the updates for the same tokens, each noisier
    "tokens2048": ["data.max_tokens=2048"],
    # post-norm: each sublayer's LayerNorm after its residual sum (the original Transformer's and
    # fairseq's default; the recipe: pre-norm), no final LayerNorm
    "postnorm": ["model.norm_first=false"],
    **RESEARCH_LEVERS,
    "sinusoidal": ["model.positions=sinusoidal"],  # the recipe before 2026-11-28 (now RoPE)
}


# name -> overrides of the GPU recipe (experiment=multi30k_en_de: 12,000 updates, warmup-stable-
# decay, dropout 0.3, bf16-mixed); README, "The GPU recipe's levers".
GPU_LEVERS: dict[str, list[str]] = {
    "recipe": [],
    "invsqrt": ["optim=adamw"],  # warmup, inverse square root: the recipe before 2026-11-24
    "linear": ["optim=adamw_linear"],
    "cosine": ["optim=adamw_cosine"],
    "dropout0.2": ["model.dropout=0.2"],  # the CPU recipe's
    "ema": ["ema.decay=0.999"],
    "rdrop": ["loss.rdrop_alpha=5"],
    "seed1": ["seed=1"],
    "seed2": ["seed=2"],  # seeds 1-3 and the recipe: four models side by side (--ensemble)
    "seed3": ["seed=3"],
    "attndrop0.1": ATTNDROP,
    "ls0.2": ["loss.label_smoothing=0.2"],
    **RESEARCH_LEVERS,
    "rope": ["model.positions=rope"],  # the CPU recipe's positions (the GPU recipe: sinusoidal)
}
# Every GPU run: cheaper validation (val/bleu is monitoring here, not the score), no maps.
GPU_COMMON = ["validation.bleu_sentences=300", "~callbacks.attention_maps"]


def lever_table(args: argparse.Namespace) -> dict[str, list[str]]:
    """The levers of the recipe ``args`` trains: the GPU's with ``--gpu``, else the CPU's."""
    return GPU_LEVERS if args.gpu else LEVERS


def overrides(name: str, levers: dict[str, list[str]] = LEVERS) -> list[str]:
    """A lever's overrides of the recipe; ``invsqrt+fp32`` joins levers (the earlier recipe)."""
    return [o for part in name.split("+") for o in levers[part]]


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


def train_command(lever: str, data: Path, run: Path, args: argparse.Namespace) -> list[str]:
    """train.py for one lever: the CPU recipe for ``args.minutes``, or with ``args.gpu`` the GPU
    recipe for ``args.steps`` updates, resumed from its ``last.ckpt`` when there is one."""
    if args.gpu:
        budget = ["experiment=multi30k_en_de", f"trainer.max_steps={args.steps}",
                  "trainer.max_epochs=-1", *([] if args.dry_run else GPU_COMMON)]  # fmt: skip
        last = run / "checkpoints" / "last.ckpt"
        if last.is_file():
            budget.append(f"ckpt_path={last}")
    else:
        seconds = 5.0 if args.dry_run else args.minutes * 60
        budget = ["experiment=multi30k_en_de_cpu", f"trainer.max_time={max_time(seconds)}"]
    return [
        sys.executable, str(REPO / "train.py"), *budget,
        f"data.root={data}", "logger=csv", f"hydra.run.dir={run}",
        "trainer.enable_progress_bar=false",
        *([*DRY_TRAIN, f"data.cache_dir={run.parent / 'cache'}"] if args.dry_run else []),
        *overrides(lever, lever_table(args)),
    ]  # fmt: skip


def checkpoints(run: Path) -> dict[str, str]:
    """The checkpoints scored: ``avg`` (the recipe's: last 10 complete epochs), ``last``."""
    found = {}
    if any((run / "checkpoints" / "epochs").glob("*.ckpt")):
        found["avg"] = str(run / "checkpoints" / "epochs" / "*.ckpt")
    if (run / "checkpoints" / "last.ckpt").is_file():
        found["last"] = str(run / "checkpoints" / "last.ckpt")
    return found


def score(ckpt: str | list[str], data: Path, split: str, out: Path, dry: bool) -> dict[str, Any]:
    """``evaluate.py ckpt_path=ckpt data.root=data split=split`` in this process: its metrics;
    several checkpoints decode as an ensemble."""
    from hydra import compose, initialize_config_dir

    from transformer.configs import CONFIG_DIR
    from transformer.evaluation import evaluate

    if isinstance(ckpt, str):
        chosen = [f"ckpt_path='{ckpt}'"]
    else:
        chosen = ["ckpt_path=[" + ",".join(f"'{c}'" for c in ckpt) + "]", "ensemble=true"]
    overrides = [*chosen, f"data.root={data}", f"split={split}",
                 f"paths.output_dir={out}", *(["decode.beam_size=2"] if dry else [])]  # fmt: skip
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
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


def finished(args: argparse.Namespace, updates: int | None, returncode: int | None) -> bool:
    """Whether a run has its whole budget: all ``--steps`` updates (GPU), else exit status 0."""
    if args.gpu:
        return updates is not None and updates >= args.steps
    return returncode == 0


def train_levers(levers: list[str], data: Path, args: argparse.Namespace) -> dict[str, dict]:
    """Trains the levers whose runs lack updates, ``args.parallel`` at a time, until
    ``args.deadline`` seconds (then SIGTERM: each writes ``last.ckpt`` and stops). Each run's
    ``bench.json`` sums its training calls' wall time and keeps the last exit status."""
    pending = [
        lv for lv in levers
        if not finished(args, global_step(args.out / lv), _state(lv, args)["rc"])
    ]  # fmt: skip
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    start = time.monotonic()
    stopping = False
    while pending or running:
        while pending and len(running) < args.parallel and not stopping:
            lever = pending.pop(0)
            run = args.out / lever
            with open(args.out / f"{lever}.log", "a") as log:
                proc = subprocess.Popen(train_command(lever, data, run, args), cwd=REPO,
                                        stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
            running[lever] = (proc, time.monotonic())
        for lever, (proc, began) in list(running.items()):
            if proc.poll() is not None:
                state = _state(lever, args)
                state["rc"] = proc.returncode
                state["train_wall_s"] = round(state["train_wall_s"] + time.monotonic() - began, 1)
                state["calls"] += 1
                # (a run stopped before train.py made its directory has none yet)
                (args.out / lever).mkdir(parents=True, exist_ok=True)
                (args.out / lever / "bench.json").write_text(json.dumps(state) + "\n")
                del running[lever]
        if args.deadline and not stopping and time.monotonic() - start > args.deadline:
            stopping = True
            pending = []
            for proc, _ in running.values():
                proc.send_signal(signal.SIGTERM)
        if running:
            time.sleep(0.5 if args.dry_run else 5.0)
    return {lv: _state(lv, args) for lv in levers}


def _state(lever: str, args: argparse.Namespace) -> dict[str, Any]:
    path = args.out / lever / "bench.json"
    if path.is_file():
        return json.loads(path.read_text())
    return {"rc": None, "train_wall_s": 0.0, "calls": 0}


def lever_result(lever: str, state: dict, data: Path, args: argparse.Namespace) -> dict:
    """A lever's row: its training, and the scores of its checkpoints once it has finished
    (kept in ``scores.json`` with the update count: a later call scores only a changed run)."""
    run = args.out / lever
    updates = global_step(run)
    done = finished(args, updates, state["rc"])
    result: dict[str, Any] = {
        "lever": lever, "overrides": overrides(lever, lever_table(args)),
        "returncode": state["rc"], "finished": done, "train_wall_s": state["train_wall_s"],
        "calls": state["calls"], "updates": updates,
        "val_bleu": last_logged(run, "val/bleu"), "scores": {},
    }  # fmt: skip
    saved = run / "scores.json"
    kept = json.loads(saved.read_text()) if saved.is_file() else {}
    if kept and kept["updates"] == result["updates"]:
        result["scores"] = kept["scores"]
    elif done:
        for name, ckpt in checkpoints(run).items():
            for split in SCORED:
                m = score(ckpt, data, split, run / f"eval_{name}_{split}", args.dry_run)
                result["scores"].setdefault(name, {})[split] = [m["bleu"], m["bleu_lc"], m["chrf"]]
        saved.write_text(json.dumps({"updates": result["updates"], "scores": result["scores"]}))
    return result


def ensemble_result(results: list[dict[str, Any]], data: Path, args: argparse.Namespace) -> dict:
    """The levers' runs decoded together, once all have finished: a row for each checkpoint that
    every run has (``avg``: each run's last 10 epochs averaged into its ``avg10.ckpt``)."""
    from transformer.atomic import atomic_save
    from transformer.averaging import average_checkpoints
    from transformer.checkpoints import checkpoint_paths

    levers = [r["lever"] for r in results]
    result: dict[str, Any] = {
        "lever": "ensemble of " + ", ".join(levers), "members": levers,
        "finished": all(r["finished"] for r in results), "val_bleu": None, "train_wall_s": None,
        "updates": [r["updates"] for r in results], "scores": {},
    }  # fmt: skip
    saved = args.out / "ensemble.json"
    kept = json.loads(saved.read_text()) if saved.is_file() else {}
    if kept.get("members") == levers and kept.get("updates") == result["updates"]:
        result["scores"] = kept["scores"]
    elif result["finished"]:
        found = [checkpoints(args.out / lever) for lever in levers]
        for name in [n for n in found[0] if all(n in f for f in found)]:
            members = [f[name] for f in found]
            if name == "avg":  # an ensemble's member is one model: each run's average, written
                averages = [str(args.out / lever / "avg10.ckpt") for lever in levers]
                for pattern, path in zip(members, averages, strict=True):  # evaluate's expansion
                    atomic_save(average_checkpoints(checkpoint_paths(pattern)), path)
                members = averages
            for split in SCORED:
                m = score(members, data, split, args.out / f"ensemble_{name}_{split}", args.dry_run)
                result["scores"].setdefault(name, {})[split] = [m["bleu"], m["bleu_lc"], m["chrf"]]
        saved.write_text(json.dumps({k: result[k] for k in ("members", "updates", "scores")}))
    return result


def table(results: list[dict[str, Any]]) -> str:
    sets = " | ".join(f"{s} BLEU / -lc / chrF" for s in SCORED)
    lines = [f"| lever | ckpt | val/bleu greedy | {sets} | updates | train wall min |",
             "|" + "---|" * (5 + len(SCORED))]  # fmt: skip
    for r in results:
        val = "-" if r["val_bleu"] is None else f"{r['val_bleu']:.2f}"
        wall = "-" if r["train_wall_s"] is None else f"{r['train_wall_s'] / 60:.1f}"
        updates = "-" if r["updates"] is None else r["updates"]
        if isinstance(updates, list):  # an ensemble's members
            updates = " + ".join("-" if u is None else str(u) for u in updates)
        if not r.get("finished", True):
            updates = f"{updates} (unfinished)"
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
    parser.add_argument("--gpu", action="store_true", help="the GPU recipe and its levers")
    parser.add_argument("--steps", type=int, default=12000, help="--gpu: updates per lever")
    parser.add_argument("--parallel", type=int, default=1, help="--gpu: runs at once")
    parser.add_argument(
        "--deadline", type=float, help="--gpu: seconds, then stop the runs (resumed next time)"
    )
    parser.add_argument(
        "--ensemble", action="store_true", help="also score the levers' runs as one ensemble"
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny model, synthetic corpus")
    args = parser.parse_args(argv)
    levers = lever_table(args)
    if args.levers == parser.get_default("levers"):
        args.levers = ",".join(levers)
    args.levers = args.levers.split(",")
    unknown = [x for name in args.levers for x in name.split("+") if x not in levers]
    if unknown:
        which = "--gpu " if args.gpu else ""
        parser.error(
            f"unknown {which}lever(s) {', '.join(unknown)}; choose from {', '.join(levers)}"
        )
    if not args.gpu and (args.parallel != 1 or args.deadline is not None):
        parser.error("--parallel and --deadline need --gpu (time budgets must not share cores)")
    if args.ensemble and len(args.levers) < 2:
        parser.error("--ensemble needs at least two --levers (the runs it decodes together)")
    if args.steps < 1 or args.parallel < 1:
        parser.error("--steps and --parallel must be at least 1")
    if args.data is None and not args.dry_run:
        parser.error("--data DIR (the Multi30k folder) is needed, except with --dry-run")
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if args.dry_run and data is None:
            sys.path.insert(0, str(REPO))
            from transformer.data.synthetic import MULTI30K_SPLITS, write_corpus

            data = write_corpus(Path(tmp) / "corpus", MULTI30K_SPLITS, suffix=".gz")
        states = train_levers(args.levers, data, args)
        results = [lever_result(lv, states[lv], data, args) for lv in args.levers]
        if args.ensemble:
            results.append(ensemble_result(results, data, args))
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    text = table(results)
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    return results


if __name__ == "__main__":
    main()
