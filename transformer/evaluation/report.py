"""What ``evaluate.py`` prints of scores: what was scored and how it was translated, each metric
with its sacreBLEU signature, the constraints met and the translation speed."""

from __future__ import annotations

from typing import Any

# The metrics printed, by their metrics.json names (transformer.metrics.METRICS)
LABELS = {
    "bleu": "BLEU",
    "bleu_lc": "BLEU lowercased",
    "chrf": "chrF",
    "chrf_pp": "chrF++",
    "ter": "TER",
}


def scores_report(result: dict[str, Any]) -> str:
    """The lines of :func:`transformer.evaluation.evaluate`'s scores: of a split's translations,
    of input='s against reference=, or of hypotheses= against reference=."""
    lines = [_scored(result)]
    lines += [f"{label} = {result[n]:.2f}  {result['signature'][n]}" for n, label in LABELS.items()]
    if "constraints" in result:
        met, total = result["constraints"]["met"], result["constraints"]["total"]
        lines.append(
            f"constraints met = {100 * met / max(total, 1):.1f}% ({met} of {total} phrases)"
        )
    if "translate_seconds" in result:
        seconds = result["translate_seconds"]
        speed = result["num_sentences"] / max(seconds, 1e-9)
        lines.append(
            f"translated in {seconds:.1f} s by {result['engine']} on {result['device']} "
            f"({result['dtype']}), {speed:.1f} sentences/s"
        )
    return "\n".join(lines)


def _scored(result: dict[str, Any]) -> str:
    """The first line: what was scored, against what, how many sentences, by which search."""
    count = f"{result['num_sentences']} sentences"
    if "hypotheses" in result:  # translations made elsewhere
        return (
            f"hypotheses={result['hypotheses']} against reference={result['reference']} ({count})"
        )
    decode = result["decode"]
    search = {
        "greedy": "greedy",
        "beam": f"beam {decode['beam_size']}, len_penalty {decode['len_penalty']}",
        "sample": f"sample (temperature {decode['temperature']}, top_k {decode['top_k']}, "
        f"top_p {decode['top_p']}, seed {decode['seed']})",
    }[decode["strategy"]]
    if "split" not in result:  # input= translated, against reference=
        return (
            f"input={result['input']} -> {result['output']} ({count}, {search}) against "
            f"reference={result['reference']}"
        )
    models = f", ensemble of {len(result['checkpoints'])}" if result["ensemble"] else ""
    return f"{result['split']} ({result['direction']}, {count}, {search}{models})"
