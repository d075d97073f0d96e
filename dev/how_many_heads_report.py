"""The table and figure of ``dev/how_many_heads.sh``: per run of the sweep, its head setting,
parameters, updates and wall time (from ``train.log``), the last validation's BLEU, test BLEU
(``eval_test_2016_flickr/metrics.json``), the head roles (``analysis_maps``' ``roles.json``), and
how concentrated the gradient importance is and what pruning half of the heads costs
(``analysis_heads/heads.json``).

    python dev/how_many_heads_report.py OUT     # writes OUT/how_many_heads.md and .png
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from datetime import datetime
from pathlib import Path

import yaml

from transformer.config import ATTENTION_TYPES as TYPES

STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+\]")


def _training(run: Path) -> dict:
    lines = (run / "train.log").read_text().splitlines()
    times = [datetime.fromisoformat(m.group(1)) for m in map(STAMP.match, lines) if m]
    params = re.search(r"model: ([\d,]+) parameters", "\n".join(lines))
    finished = [line for line in lines if "finished at step" in line][-1]
    step = int(re.search(r"finished at step (\d+)", finished).group(1))
    val_bleu = float(re.search(r"'val/bleu': ([\d.]+)", finished).group(1))
    return {
        "params": int(params.group(1).replace(",", "")),
        "updates": step,
        "minutes": (times[-1] - times[0]).total_seconds() / 60,
        "val_bleu": val_bleu,
    }


def _roles(run: Path) -> dict[str, Counter]:
    roles = json.loads((run / "analysis_maps" / "attention" / "roles.json").read_text())
    return {kind: Counter(r for layer in roles[kind] for r in layer) for kind in TYPES}


def _importance(run: Path) -> dict:
    heads = json.loads((run / "analysis_heads" / "heads.json").read_text())
    scores = sorted((h["gradient"] for h in heads["heads"]), reverse=True)
    top = max(1, len(scores) // 4)
    by_type = {
        kind: sum(h["gradient"] for h in heads["heads"] if h["kind"] == kind) / sum(scores)
        for kind in TYPES
    }
    half = min(heads["pruning"], key=lambda p: abs(p["share_left"] - 0.5))
    return {
        "top_quarter_share": sum(scores[:top]) / sum(scores),
        "by_type": by_type,
        "baseline_bleu": heads["baseline"]["bleu"],
        "half_pruned_bleu": half["bleu"],
        "half_share_left": half["share_left"],
    }


def collect(out: Path) -> list[dict]:
    rows = []
    for run in sorted(out.glob("*/[0-9]*"), key=lambda p: (p.parent.name != "heads", int(p.name))):
        if not (run / "eval_test_2016_flickr" / "metrics.json").is_file():
            continue
        model = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())["model"]
        heads = model["num_heads"]
        test = json.loads((run / "eval_test_2016_flickr" / "metrics.json").read_text())
        rows.append({
            "run": f"{run.parent.name}/{run.name}",
            "num_heads": heads,
            "num_kv_heads": model["num_kv_heads"] or heads,  # null: one per query head
            "head_dim": model["d_model"] // heads,
            **_training(run),
            "test_bleu": test["bleu"], "test_bleu_lc": test["bleu_lc"], "test_chrf": test["chrf"],
            "roles": {k: dict(v) for k, v in _roles(run).items()},
            **_importance(run),
        })  # fmt: skip
    return rows


def _role_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {r}" for r, n in sorted(counts.items(), key=lambda x: (-x[1], x[0])))


def table(rows: list[dict]) -> str:
    lines = [
        "| heads (kv) | head dim | params | updates | minutes | val BLEU | test_2016 BLEU | -lc "
        "| chrF | top 25% of heads: share of importance | importance enc / dec / cross "
        "| greedy val BLEU, all heads / half pruned |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["by_type"]
        lines.append(
            f"| {r['num_heads']} ({r['num_kv_heads']}) | {r['head_dim']} | {r['params']:,} "
            f"| {r['updates']} | {r['minutes']:.1f} | {r['val_bleu']:.2f} | {r['test_bleu']:.2f} "
            f"| {r['test_bleu_lc']:.2f} | {r['test_chrf']:.1f} | {r['top_quarter_share']:.0%} "
            f"| {t['encoder_self']:.0%} / {t['decoder_self']:.0%} / {t['cross']:.0%} "
            f"| {r['baseline_bleu']:.2f} / {r['half_pruned_bleu']:.2f} |"
        )
    lines += ["", "Head roles (`transformer/analysis/roles.py`) per attention type:", ""]
    lines += ["| heads (kv) | encoder self | decoder self | cross |", "|---|---|---|---|"]
    for r in rows:
        cells = " | ".join(_role_text(r["roles"][k]) for k in TYPES)
        lines.append(f"| {r['num_heads']} ({r['num_kv_heads']}) | {cells} |")
    return "\n".join(lines) + "\n"


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mha = [r for r in rows if r["num_kv_heads"] == r["num_heads"]]
    gqa = [r for r in rows if r["num_kv_heads"] != r["num_heads"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = [r["num_heads"] for r in mha]
    left.plot(x, [r["test_bleu"] for r in mha], "o-", label="test_2016_flickr, beam 5")
    left.plot(x, [r["val_bleu"] for r in mha], "s--", label="val, first 300, greedy")
    for r in gqa:
        left.plot(r["num_heads"], r["test_bleu"], "^", color="C2")
        left.annotate(f"kv={r['num_kv_heads']}", (r["num_heads"], r["test_bleu"]),
                      textcoords="offset points", xytext=(6, -4), fontsize=8)  # fmt: skip
    left.set(xscale="log", xlabel="heads per layer (d_model fixed)", ylabel="BLEU",
             title="BLEU at equal updates")  # fmt: skip
    left.set_xticks(x, [str(h) for h in x])
    left.minorticks_off()
    left.legend(fontsize=8)
    names = sorted({role for r in rows for c in r["roles"].values() for role in c})
    labels = [f"{r['num_heads']}/{r['num_kv_heads']}" for r in rows]
    bottom = [0.0] * len(rows)
    for i, role in enumerate(names):
        share = [sum(c.get(role, 0) for c in r["roles"].values())
                 / sum(sum(c.values()) for c in r["roles"].values()) for r in rows]  # fmt: skip
        right.bar(labels, share, bottom=bottom, label=role, color=f"C{i}")
        bottom = [b + s for b, s in zip(bottom, share, strict=True)]
    right.set(xlabel="heads / kv heads", ylabel="share of heads", title="Head roles, all types")
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the OUT of dev/how_many_heads.sh")
    args = parser.parse_args()
    rows = collect(args.out)
    if not rows:
        raise SystemExit(f"error: no evaluated run under {args.out} (run dev/how_many_heads.sh)")
    (args.out / "how_many_heads.json").write_text(json.dumps(rows, indent=1))
    (args.out / "how_many_heads.md").write_text(table(rows))
    figure(rows, args.out / "how_many_heads.png")
    print(table(rows))


if __name__ == "__main__":
    main()
