"""Helpers of ``dev/gpu_check.sh`` (the checks to run when a GPU is lent; docs/benchmarks.md).

Each subcommand does one small job for the shell script and prints its result:

    corpus DIR                    a tiny synthetic corpus named like Multi30k's files (dry runs)
    env                           python, torch, CUDA, GPU, bf16 and package versions (key=value)
    junit-merge OUT IN...         one JUnit XML from several pytest runs
    pytest-shards --shard F...    test files in parallel pytest processes (-- pytest options)
    run-info RUN [--log F]        a training run's state: checkpoint, csv metrics (key=value)
    note KIND LOG                 a one-line result of a bench log for the summary table
    merge-json OUT LABEL=FILE...  one JSON object of several files (bench_train's steps)
    pace RUN OUT [--variant V]    one stage-2 run of the recipe: updates, fit-loop seconds, profile
    record-call RUN key=value...  remember one recipe-stage training call (its wall time) in RUN
    recipe-metrics RUN OUT        recipe_metrics.json: training, profiles, evaluations
    report STAGE DIR              the stage's results as markdown tables, for docs/benchmarks.md
    summary STEPS                 the table of the steps run (stage, step, status, seconds, note)

It imports torch only where it needs it, so the quick subcommands start fast.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import importlib.metadata
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def cmd_corpus(args: argparse.Namespace) -> None:
    """``{split}.{en,de}.gz`` for Multi30k's five splits: read by ``data=multi30k`` (the real
    runs' source) through the same code as the real files."""
    # The made-up language pair of the tests (German-like words, each the image of one English
    # word): a few training steps already move the loss, and BLEU has something to score.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from transformer.data.synthetic import MULTI30K_SPLITS, write_corpus

    root = write_corpus(Path(args.dir), MULTI30K_SPLITS, suffix=".gz")
    splits = ", ".join(f"{s} {n}" for s, n in MULTI30K_SPLITS.items())
    print(f"synthetic corpus: {splits} pairs in {root}")


def _version(module: str) -> str:
    """Version and location of an importable module, or why it does not import."""
    try:
        mod = importlib.import_module(module)
    except Exception as err:  # any import failure is the answer
        return f"NOT IMPORTABLE ({type(err).__name__}: {err})"
    version = getattr(mod, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version(module)
        except importlib.metadata.PackageNotFoundError:
            version = "?"
    where = Path(getattr(mod, "__file__", "") or "?").parent
    return f"{version} ({where})"


def cmd_env(args: argparse.Namespace) -> None:
    import torch

    lines = {
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lines |= {
            "device_count": torch.cuda.device_count(),
            "gpu_name": torch.cuda.get_device_name(0),
            "gpu_capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
            "gpu_memory_gib": f"{props.total_memory / 2**30:.1f}",
            "gpu_multiprocessors": props.multi_processor_count,
            "bf16_supported": torch.cuda.is_bf16_supported(),
            "flash_sdp_enabled": torch.backends.cuda.flash_sdp_enabled(),
            "mem_efficient_sdp_enabled": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "cudnn_sdp_enabled": torch.backends.cuda.cudnn_sdp_enabled(),
        }
        device = torch.device("cuda")
    else:
        lines["bf16_supported"] = "n/a (no CUDA)"
        device = torch.device("cpu")
    impl = getattr(torch.nn.attention, "current_flash_attention_impl", None)
    lines["flash_attention_impl"] = impl() if impl else "n/a (torch without the registry)"
    # One bf16 attention call with a padding mask (what training runs): a broken kernel or
    # driver shows here, before any test or training run.
    try:
        q = torch.randn(2, 4, 8, 16, device=device, dtype=torch.bfloat16)
        mask = torch.ones(2, 1, 8, 8, dtype=torch.bool, device=device).tril()
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        lines["sdpa_bf16_masked"] = f"ok on {device} (finite: {bool(out.float().isfinite().all())})"
    except Exception as err:  # a broken kernel or driver: say which
        lines["sdpa_bf16_masked"] = f"FAILED: {type(err).__name__}: {err}"
    for module in ("lightning", "triton", "transformers", "sentencepiece", "sacrebleu", "hydra",
                   "omegaconf", "datasets", "wandb", "pyarrow", "matplotlib", "numpy",
                   "pytest"):  # fmt: skip
        lines[module] = _version(module)
    lines["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    for key, value in lines.items():
        print(f"{key}={value}")


def cmd_junit_merge(args: argparse.Namespace) -> None:
    """pytest writes one ``<testsuites>`` per run; the merged file holds every run's suite."""
    import xml.etree.ElementTree as ET

    merged = ET.Element("testsuites")
    for path in args.inputs:
        name, _, file = path.partition("=")
        if not Path(file).is_file():
            print(f"{file}: missing (pytest did not write it)")
            continue
        root = ET.parse(file).getroot()
        for suite in [root] if root.tag == "testsuite" else list(root):
            suite.set("name", name)
            merged.append(suite)
    ET.ElementTree(merged).write(args.out, encoding="utf-8", xml_declaration=True)
    totals = {k: sum(int(s.get(k, 0)) for s in merged) for k in ("tests", "failures", "errors")}
    print(f"junit: {len(merged)} suites, {totals} -> {args.out}")


def cmd_pytest_shards(args: argparse.Namespace) -> None:
    """Several pytest processes at once, one per shard of test files, each with its share of the
    cores: the GPU-relevant files take minutes one after the other, and the GPU machine has 16
    cores. Prints every shard's output, writes one JUnit file, and exits with pytest's status
    (5, no test ran, only if no shard ran one). SIGTERM (the script's time limit) stops them all
    and still prints what they wrote."""
    import signal
    import subprocess

    work = Path(args.junit).parent
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    procs, logs, junits = [], [], []
    for i, shard in enumerate(args.shard):
        files = shard.split()
        logs.append(work / f"pytest_shard{i}.log")
        junits.append(work / f"pytest_shard{i}.xml")
        cmd = [sys.executable, "-m", "pytest", *args.pytest_args, *files,
               f"--junitxml={junits[-1]}"]  # fmt: skip
        with open(logs[-1], "w") as log:
            log.write("# " + " ".join(cmd) + "\n")
            log.flush()
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))

    def report(codes: list[int | None]) -> None:
        for log, code in zip(logs, codes, strict=True):
            print(f"===== {log.name}: exit status {code}")
            print(log.read_text(errors="replace"), end="")
        merge = argparse.Namespace(out=args.junit, inputs=[f"units={j}" for j in junits])
        cmd_junit_merge(merge)

    def stop(signum, frame) -> None:
        for proc in procs:
            proc.terminate()
        report([proc.wait() for proc in procs])
        sys.exit(124)

    signal.signal(signal.SIGTERM, stop)
    codes = [proc.wait() for proc in procs]
    report(codes)
    failing = [c for c in codes if c not in (0, 5)]
    sys.exit(failing[0] if failing else (5 if all(c == 5 for c in codes) else 0))


def _csv_rows(run: Path) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for path in sorted(run.glob("csv/version_*/metrics.csv")):  # a resumed run adds a version
        with open(path, newline="") as f:
            rows += list(csv.DictReader(f))
    return rows


def _floats(rows: list[dict[str, str]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key) not in (None, "")]


def _load_ckpt(path: Path) -> dict[str, Any]:
    """A checkpoint train.py wrote, loaded as the project loads them: tensors and plain values
    only (``weights_only=True``: no pickled code runs)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from transformer.checkpoints import load_checkpoint
    from transformer.errors import one_line_errors

    with one_line_errors():  # a damaged checkpoint: one line, as train.py's
        return load_checkpoint(path)


def run_info(run: Path, log: Path | None = None) -> dict[str, Any]:
    """What a training run left: its last checkpoint's step, epoch, optimizer and timer, its
    logged metrics, and (from its log) the precision Lightning chose."""
    info: dict[str, Any] = {"run": str(run)}
    last = run / "checkpoints" / "last.ckpt"
    if last.is_file():
        ck = _load_ckpt(last)
        info["global_step"] = ck["global_step"]
        info["epoch"] = ck["epoch"]  # epochs begun
        group = ck["optimizer_states"][0]["param_groups"][0]
        info["optimizer_fused"] = group.get("fused")
        timer = ck.get("callbacks", {}).get("Timer")
        if timer:
            info["timer_train_s"] = round(timer["time_elapsed"]["train"], 1)
    else:
        info["last_ckpt"] = "missing"
    info["epoch_checkpoints"] = len(list((run / "checkpoints" / "epochs").glob("*.ckpt")))
    info["attention_analyses"] = len(list((run / "attention").glob("step*")))
    rows = _csv_rows(run)
    losses = _floats(rows, "train/loss")
    speeds = _floats(rows, "train/tokens_per_sec")
    bleus = _floats(rows, "val/bleu")
    if losses:
        info["train_loss_first_last"] = f"{losses[0]:.3f} -> {losses[-1]:.3f}"
    if speeds:  # the later half: after warm-up (and compilation)
        info["tokens_per_sec_median"] = round(statistics.median(speeds[len(speeds) // 2 :]))
    if bleus:
        info["val_bleu_last"] = round(bleus[-1], 2)
        info["val_bleu_best"] = round(max(bleus), 2)
    info["grad_norm_logged"] = bool(_floats(rows, "train/grad_norm"))
    if log is not None and log.is_file():
        text = log.read_text(errors="replace")
        # Lightning 2.6 says "Using bfloat16 Automatic Mixed Precision (AMP)" (or "16bit")
        amp = re.search(r"Using (\S+) Automatic Mixed Precision", text)
        names = {"bfloat16": "bf16-mixed", "16bit": "16-mixed"}
        info["precision"] = names.get(amp.group(1), amp.group(1)) if amp else "32-true (no AMP)"
        gpu = re.search(r"GPU available: (.*)", text)
        info["gpu_line"] = gpu.group(1).strip() if gpu else None
    return info


def cmd_run_info(args: argparse.Namespace) -> None:
    info = run_info(Path(args.run), Path(args.log) if args.log else None)
    if args.max_steps is not None:
        info["finished"] = info.get("global_step", -1) >= args.max_steps
    for key, value in info.items():
        print(f"{key}={value}")


def _table_row(log: str, first_cell: str) -> list[str] | None:
    for line in log.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells and cells[0] == first_cell:
            return cells
    return None


def cmd_note(args: argparse.Namespace) -> None:
    """The figure worth a glance in the summary table, from a bench script's output."""
    log = Path(args.log).read_text(errors="replace") if Path(args.log).is_file() else ""
    note = "no result line"
    if args.kind == "train":
        row = _table_row(log, "ours")
        if row:  # system, parameters, tokens/s, step ms, TFLOP/s, MFU, memory, SDPA, ratio
            peers = r"torch\.nn\.Transformer|MarianMTModel|ours, [^|]+?"
            others = re.findall(rf"^\| ({peers}) \|.*\| (\S+x) \|$", log, re.M)
            ratios = "".join(f"; {r} vs {n.split('.')[-1]}" for n, r in others)
            note = f"ours {row[2]} tok/s, MFU {row[5]}, {row[6]}, SDPA {row[7]}{ratios}"
    elif args.kind == "decode":  # | system | seconds | sentences/s | tokens/s | its time / ours |
        row = _table_row(log, "ours")  # beam search's table comes first
        if row:
            marian = _table_row(log, "MarianMTModel.generate")
            note = f"ours {row[2]} sent/s" + (f", Marian {marian[4]} our time" if marian else "")
            other = re.search(r"^\| ours, (static_search=\w+) \|.*\| (\S+x) .*\|$", log, re.M)
            if other:  # --compare-search: the other search step's time / ours
                note += f", {other[1]} {other[2]} our time"
    elif args.kind == "eval":  # LOG is evaluate.py's metrics.json
        m = json.loads(log) if log else None
        if m:
            note = (f"BLEU {m['bleu']:.2f}, -lc {m['bleu_lc']:.2f}, chrF {m['chrf']:.2f}, "
                    f"{m['num_sentences']} sentences in {m['translate_seconds']:.1f} s "
                    f"({len(m['checkpoints'])} checkpoints averaged)")  # fmt: skip
    elif args.kind == "validation":
        row = _table_row(log, "attention maps: the training thread")
        decoding = [line for line in log.splitlines() if line.startswith("| greedy decoding")]
        if row:
            note = f"maps {row[1]} s on the training thread; " + "; ".join(
                f"{c[0].split(', ')[-1]} {c[1]} s"
                for c in (d.strip("|").split("|") for d in decoding)
            )
    elif args.kind == "attention":
        rows = [line for line in log.splitlines() if re.match(r"\| (train|decode):", line)]
        note = f"{len(rows)} shapes timed (no masked/padded shapes: the script has none)"
    print(note)


def cmd_merge_json(args: argparse.Namespace) -> None:
    """{LABEL: the file's JSON} for each LABEL=FILE that exists."""
    merged = {}
    for item in args.inputs:
        label, _, file = item.partition("=")
        if Path(file).is_file():
            merged[label] = json.loads(Path(file).read_text())
    Path(args.out).write_text(json.dumps(merged, indent=1) + "\n")
    print(f"{', '.join(merged) or 'nothing'} -> {args.out}")


def profile_totals(run: Path) -> dict[str, tuple[int, float]]:
    """Every SimpleProfiler report a run wrote, summed per action: (calls, seconds)."""
    totals: dict[str, tuple[int, float]] = {}
    for path in sorted(run.glob("fit-profile*.txt")):
        for action, (n, seconds) in parse_profile(path).items():
            calls, total = totals.get(action, (0, 0.0))
            totals[action] = (calls + n, total + seconds)
    return totals


def cmd_pace(args: argparse.Namespace) -> None:
    """One stage-2 run of the recipe: appended to OUT (recipe_pace.json), one line printed.

    The fit loop's seconds are the profiler's ``run_training_epoch`` (validation runs inside
    epochs): updates / those seconds is the run's pace, validation and maps included. Per-hook
    rows are host times: with no device sync a step, a step's GPU time shows where the host
    next waits for it, so shares come from comparing whole runs (the recipe against the same
    run without validation), not from these rows."""
    run = Path(args.run)
    info = run_info(run)
    totals = profile_totals(run)
    fit_loop = totals.get("run_training_epoch", (0, 0.0))[1]
    updates = info.get("global_step", 0)
    entry = {
        "variant": args.variant,
        "overrides": args.overrides,
        "updates": updates,
        "fit_loop_s": round(fit_loop, 2),
        "updates_per_s": round(updates / fit_loop, 2) if fit_loop else None,
        "process_s": args.seconds,
        "val_bleu_last": info.get("val_bleu_last"),
        "tokens_per_sec_median": info.get("tokens_per_sec_median"),
        "attention_analyses": info.get("attention_analyses"),
        "profile_s": {
            key: round(totals[action][1], 2)
            for action, key in PROFILE_ROWS.items()
            if action in totals
        },  # fmt: skip
    }
    out = Path(args.out)
    record = json.loads(out.read_text()) if out.is_file() else {"runs": []}
    record["runs"].append(entry)
    out.write_text(json.dumps(record, indent=1) + "\n")
    pace = f"{entry['updates_per_s']} updates/s" if fit_loop else "no profile"
    print(f"{updates} updates, fit loop {entry['fit_loop_s']} s: {pace}, val/bleu "
          f"{entry['val_bleu_last']}, maps {entry['attention_analyses']}")  # fmt: skip


def _env(out: Path) -> dict[str, str]:
    path = out / "env.txt"
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    return dict(line.split("=", 1) for line in lines if re.match(r"^[a-z_0-9]+=", line))


def _train_tables(out: Path) -> list[str]:
    path = out / "train_steps.json"
    if not path.is_file():
        return ["(no train_steps.json: bench_train did not finish)"]
    return bench_tables(json.loads(path.read_text()))


def bench_tables(runs: dict[str, Any]) -> list[str]:
    """bench_train's runs (label -> its JSON) as markdown: a row per system, then the time of
    ours (and its variants) by category, then a note per run."""
    lines = [
        "| preset | system | target tokens/s | step ms p10 / p50 / p90 | MFU | peak memory "
        "| SDPA | kernels a step | GPU busy | host ms a step | ours / system |",
        "|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    split: list[str] = []
    notes = []
    for preset, run in runs.items():
        model, options = run["model"], run["options"]
        notes.append(
            f"- {preset}: d_model {model['d_model']}, {model['num_heads']} heads, "
            f"{model['num_encoder_layers']}+{model['num_decoder_layers']} layers, FFN "
            f"{model['d_ff']}, vocabulary {model['tgt_vocab_size']}, "
            f"{run.get('batch_tokens', options.get('tokens'))}-token batches from "
            f"{options['data'] or 'synthetic sentences'}, {run['dtype']}, {options['steps']} "
            f"timed batches; train.py {' '.join(run.get('overrides', []))}; {run['environment']}"
        )
        for r in run["systems"]:
            p = r["profile"] or {}
            sdpa = ", ".join(f"{k} x{v}" for k, v in sorted(p.get("sdpa", {}).items())) or "none"
            busy = p.get("gpu_busy")
            lines.append(
                f"| {preset} | {r['name']} | {r['tokens_per_s']:,.0f} | "
                f"{' / '.join(f'{x:.1f}' for x in r['step_ms'])} | "
                + (f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a")
                + " | "
                + (f"{r['peak_memory_mib']:,.0f} MiB" if r["peak_memory_mib"] else "n/a")
                + f" | {sdpa} | {p.get('kernels', '?')} | "
                + (f"{busy:.0%}" if busy is not None else "n/a")
                + f" | {p.get('host_ms', float('nan')):.1f} | "
                + (f"{r['ratio']:.2f}x" if r["ratio"] else "-")
                + " |"
            )
            if r.get("categories"):
                names = [c for c in r["categories"] if c != "steps"]  # step_profile's, in order
                if not split:
                    split += [
                        "| preset | system | " + " | ".join(names) + " | step ms | padding |",
                        "|---|---|" + "---:|" * (len(names) + 2),
                    ]
                cells = [r["categories"][c] for c in names]
                total = sum(cells)
                split.append(
                    f"| {preset} | {r['name']} | "
                    + " | ".join(f"{x:.2f} ({x / total:.0%})" for x in cells)
                    + f" | {total:.2f} | {r['padding']:.1%} |"
                )
    heading = "Time a step by category, ms (bench/step_profile.py; padding: of the products' FLOPs)"
    return [*lines, "", heading, "", *split, "", *notes]


def _step_tables(out: Path) -> list[str]:
    path = out / "step_runs.json"
    if not path.is_file():
        return ["(no step_runs.json: no bench_train run finished)"]
    tests = out / "step_tests.log"
    log = tests.read_text(errors="replace") if tests.is_file() else ""
    ended = r"^.*(?:passed|failed|error|collected|no tests ran).* in [\d.]+s.*$"
    results = "; ".join(re.findall(ended, log, re.M)) or "no result"
    tables = bench_tables(json.loads(path.read_text()))
    return [*tables, "", f"CUDA tests of the options (`pytest -m cuda`): {results}"]


def _pace_tables(out: Path) -> list[str]:
    path = out / "recipe_pace.json"
    if not path.is_file():
        return ["(no recipe_pace.json: no run of the recipe finished)"]
    runs = json.loads(path.read_text())["runs"]
    base = next((r for r in runs if r["variant"] == "recipe"), None)
    lines = [
        "| run | overrides | updates | fit loop s | updates/s | / the recipe's | val/bleu "
        "| maps hook s | validation steps s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        rel = "-"
        if base and base["updates_per_s"] and r["updates_per_s"] and r is not base:
            rel = f"{r['updates_per_s'] / base['updates_per_s']:.2f}x"
        prof = r["profile_s"]
        lines.append(
            f"| {r['variant']} | `{r['overrides'] or '-'}` | {r['updates']} | {r['fit_loop_s']} "
            f"| {r['updates_per_s']} | {rel} | {r['val_bleu_last']} | "
            f"{prof.get('attention_maps', '-')} | {prof.get('validation_steps', '-')} |"
        )
    alone = next((r for r in runs if r["variant"] == "no validation"), None)
    if base and alone and base["fit_loop_s"] and alone["fit_loop_s"]:
        share = alone["fit_loop_s"] / base["fit_loop_s"] * alone["updates"] / base["updates"]
        lines += ["", f"Training steps' share of the recipe's fit loop (the run without "
                      f"validation over the recipe, same updates): {share:.0%}"]  # fmt: skip
    validation = out / "validation.txt"
    if validation.is_file():
        table = [line for line in validation.read_text().splitlines() if line.startswith("|")]
        head = [line for line in validation.read_text().splitlines() if "val BLEU" in line]
        lines += ["", "Each part of one validation (bench/bench_validation.py):", *head[-1:], "",
                  *table]  # fmt: skip
    return lines


def _command_tables(log: Path) -> list[str]:
    """Each command of a bench log (``$ ...``) with the markdown table lines it printed."""
    if not log.is_file():
        return [f"(no {log.name})"]
    lines: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("$ "):
            lines += ["", f"`{line[2:].strip()}`", ""]
        elif line.startswith("|"):
            lines.append(line)
    return lines


def _recipe_tables(out: Path) -> list[str]:
    path = out / "recipe_metrics.json"
    if not path.is_file():
        return ["(no recipe_metrics.json)"]
    m = json.loads(path.read_text())
    t = m["training"]
    lines = [
        f"{m['recipe']}: {t.get('global_step')} of {t.get('max_steps')} updates"
        + ("" if t.get("finished") else " (NOT FINISHED: PARTIAL)"),
        "",
        "| test set | BLEU | BLEU -lc | chrF | translate s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, e in m["evaluations"].items():
        lines.append(f"| {name} | {e['bleu']} | {e['bleu_lc']} | {e['chrf']} | "
                     f"{e['translate_seconds']} |")  # fmt: skip
    return lines


REPORTS = {
    "1": ("Training speed (bench_train)", _train_tables),
    "2": ("The recipe's pace", _pace_tables),
    "3": (
        "Decoding (bench_decode, bench_attention)",
        lambda out: _command_tables(out / "decode.txt"),
    ),
    "step": ("The product's training step", _step_tables),
    "recipe": ("The GPU recipe", _recipe_tables),
}


def cmd_report(args: argparse.Namespace) -> None:
    """The stage's results as markdown, printed and appended to DIR/results.md."""
    out = Path(args.dir)
    env = _env(out)
    title, tables = REPORTS[args.stage]
    text = "\n".join([
        f"### {title} ({time.strftime('%Y-%m-%d', time.gmtime())}, `bash dev/gpu_check.sh "
        f"{args.stage}`)",
        "",
        f"{env.get('gpu_name', 'no GPU (dry run)')}, torch {env.get('torch', '?')}, CUDA "
        f"{env.get('torch_cuda', '?')}, cuDNN {env.get('cudnn', '?')}, flash attention "
        f"{env.get('flash_attention_impl', '?')}, commit {args.commit}.",
        "",
        *tables(out),
        "",
    ])  # fmt: skip
    with open(out / "results.md", "a") as f:
        f.write(text + "\n")
    print(text)


def cmd_record_call(args: argparse.Namespace) -> None:
    path = Path(args.run) / "gpu_check_calls.json"
    calls = json.loads(path.read_text()) if path.is_file() else []
    entry: dict[str, Any] = {}
    for item in args.items:
        key, _, value = item.partition("=")
        try:
            entry[key] = json.loads(value)
        except json.JSONDecodeError:
            entry[key] = value
    calls.append(entry)
    path.write_text(json.dumps(calls, indent=1) + "\n")


def parse_profile(path: Path) -> dict[str, tuple[int, float]]:
    """Lightning SimpleProfiler's report: action -> (calls, total seconds)."""
    rows = {}
    for line in path.read_text(errors="replace").splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) >= 6 and cells[1] and cells[3].isdigit():
            try:
                rows[cells[1]] = (int(cells[3]), float(cells[4]))
            except ValueError:
                continue
    return rows


# The profiler rows that say where a recipe's time goes (Lightning's names; the callback's hook
# is the attention-map cost, the product feature whose price the recipe should show).
PROFILE_ROWS = {
    "Total": "profiled_total",
    "run_training_batch": "training_batches",
    "[Strategy]SingleDeviceStrategy.validation_step": "validation_steps",
    "[LightningModule]TranslationModule.on_validation_epoch_end": "validation_scoring",
    "[Callback]AttentionMapsCallback.on_validation_epoch_end": "attention_maps",
    "save_checkpoint": "checkpoint_writes",
    "[_TrainingEpochLoop].train_dataloader_next": "train_data_loading",
}


def cmd_recipe_metrics(args: argparse.Namespace) -> None:
    run = Path(args.run)
    calls_path = run / "gpu_check_calls.json"
    calls = json.loads(calls_path.read_text()) if calls_path.is_file() else []
    info = run_info(run)
    info["finished"] = info.get("global_step", -1) >= args.max_steps
    info["max_steps"] = args.max_steps
    profile: dict[str, dict[str, float]] = {}
    for path in sorted(run.glob("fit-profile_call*.txt")):
        for action, (n, total) in parse_profile(path).items():
            key = PROFILE_ROWS.get(action)
            if key:
                entry = profile.setdefault(key, {"calls": 0, "seconds": 0.0})
                entry["calls"] += n
                entry["seconds"] = round(entry["seconds"] + total, 2)
    maps = profile.get("attention_maps")
    if maps and info["attention_analyses"]:
        # the hook runs at every validation but works at every 5th: per analysis, not per call
        maps["per_analysis_s"] = round(maps["seconds"] / info["attention_analyses"], 2)
        fit = profile.get("profiled_total", {}).get("seconds")
        if fit:
            maps["share_of_profiled_time"] = round(maps["seconds"] / fit, 4)
    evaluations = {}
    for path in sorted(run.glob("eval/*/metrics.json")):
        m = json.loads(path.read_text())
        wall = path.parent / "wall_seconds"
        evaluations[path.parent.name] = {
            "split": m["split"], "bleu": round(m["bleu"], 2), "bleu_lc": round(m["bleu_lc"], 2),
            "chrf": round(m["chrf"], 2), "signature": m["signature"],
            "num_sentences": m["num_sentences"], "checkpoints_averaged": len(m["checkpoints"]),
            "translate_seconds": m["translate_seconds"], "device": m["device"],
            "dtype": m["dtype"], "beam_size": m["decode"]["beam_size"],
            "eval_wall_seconds": float(wall.read_text()) if wall.is_file() else None,
        }  # fmt: skip
    result = {
        "recipe": "experiment=multi30k_en_de (model=mini, 12,000 updates, warmup-stable-decay, "
        "last 10 epochs averaged, beam 5)",
        "training": info,
        "training_calls": calls,
        "train_process_seconds_total": round(sum(c.get("seconds", 0) for c in calls), 1),
        "profile": profile,
        "evaluations": evaluations,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"recipe metrics -> {args.out}")
    print(f"finished={info['finished']} epoch={info.get('epoch')} "
          f"step={info.get('global_step')} val_bleu_last={info.get('val_bleu_last')}")  # fmt: skip
    if maps:
        print(f"attention maps: {maps['seconds']} s over {info['attention_analyses']} analyses")
    for name, e in evaluations.items():
        print(f"{name}: BLEU {e['bleu']} | -lc {e['bleu_lc']} | chrF {e['chrf']} | translate "
              f"{e['translate_seconds']} s | wall {e['eval_wall_seconds']} s")  # fmt: skip


def cmd_summary(args: argparse.Namespace) -> None:
    rows = []
    if Path(args.steps).is_file():
        rows = [line.rstrip("\n").split("\t") for line in open(args.steps) if line.strip()]
    lines = ["| stage | step | status | seconds | result |", "|---|---|---|---|---|"]
    lines += [f"| {' | '.join(r[:5])} |" for r in rows]
    failed = sum(r[2] not in ("ok", "warn", "skip") for r in rows)
    lines.append(f"{len(rows)} steps, {failed} failed")
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text, end="")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("corpus").add_argument("dir")
    sub.add_parser("env")
    s = sub.add_parser("junit-merge")
    s.add_argument("out")
    s.add_argument("inputs", nargs="+", help="NAME=FILE")
    s = sub.add_parser("pytest-shards")
    s.add_argument("--shard", action="append", required=True, help="test files, space-separated")
    s.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each shard")
    s.add_argument("--junit", required=True, help="the merged JUnit file")
    s.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then pytest's options")
    s = sub.add_parser("run-info")
    s.add_argument("run")
    s.add_argument("--log")
    s.add_argument("--max-steps", type=int)
    s = sub.add_parser("note")
    s.add_argument("kind", choices=["train", "decode", "attention", "eval", "validation"])
    s.add_argument("log")
    s = sub.add_parser("merge-json")
    s.add_argument("out")
    s.add_argument("inputs", nargs="+", help="LABEL=FILE")
    s = sub.add_parser("pace")
    s.add_argument("run")
    s.add_argument("out")
    s.add_argument("--variant", required=True)
    s.add_argument("--overrides", default="")
    s.add_argument("--seconds", type=float, default=None, help="the process's wall seconds")
    s = sub.add_parser("report")
    s.add_argument("stage", choices=list(REPORTS))
    s.add_argument("dir")
    s.add_argument("--commit", default="?")
    s = sub.add_parser("record-call")
    s.add_argument("run")
    s.add_argument("items", nargs="*")
    s = sub.add_parser("recipe-metrics")
    s.add_argument("run")
    s.add_argument("out")
    s.add_argument("--max-steps", type=int, default=12000)
    s = sub.add_parser("summary")
    s.add_argument("steps")
    s.add_argument("--out")
    args = p.parse_args()
    if getattr(args, "pytest_args", None) and args.pytest_args[0] == "--":
        args.pytest_args = args.pytest_args[1:]
    globals()[f"cmd_{args.cmd.replace('-', '_')}"](args)


if __name__ == "__main__":
    main()
