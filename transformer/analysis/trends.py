"""Head statistics over training, compact for the dashboard: one table of every (step, type,
layer, head, statistic, value) so far, and one line chart per (type, statistic) with a line per
head, instead of a scalar series per head and statistic."""

from __future__ import annotations

from typing import Any

import wandb

TREND_COLUMNS = ["step", "type", "layer", "head", "statistic", "value"]


def trend_rows(records: list[dict]) -> list[list[Any]]:
    """The statistics of the explorer's records (see :mod:`transformer.analysis.explorer`) as
    rows of ``TREND_COLUMNS``."""
    return [
        [record["step"], kind, layer, head, name, value]
        for record in records
        for kind, stats in record["stats"].items()
        for name, grid in stats.items()
        for layer, row in enumerate(grid)
        for head, value in enumerate(row)
    ]


def trend_charts(rows: list[list[Any]]) -> dict[str, Any]:
    """``attn_trends/<type>/<statistic>`` -> a wandb line chart over steps, one line per head
    (``l<layer>h<head>``)."""
    series: dict[tuple[str, str], dict[str, dict[int, float]]] = {}
    for step, kind, layer, head, name, value in rows:
        series.setdefault((kind, name), {}).setdefault(f"l{layer}h{head}", {})[step] = value
    charts = {}
    for (kind, name), heads in series.items():
        steps = sorted({step for values in heads.values() for step in values})
        charts[f"attn_trends/{kind}/{name}"] = wandb.plot.line_series(
            xs=steps,
            ys=[[values[step] for step in steps] for values in heads.values()],
            keys=list(heads),
            title=f"{kind} attention: {name} per head",
            xname="step",
        )
    return charts
