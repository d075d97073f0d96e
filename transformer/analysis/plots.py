"""Matplotlib figures (Agg, no pyplot state): head grids of attention maps and layer x head
heatmaps. Each function returns a :class:`~matplotlib.figure.Figure`; :func:`save` writes it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from matplotlib import patheffects
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

TICK_FONT = 7
CELL_INCH = 0.17  # per piece on an axis: 40 pieces -> a 7-inch panel
OUTLINE = [patheffects.withStroke(linewidth=1.5, foreground="black")]  # readable cell labels


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _label_inch(labels: list[str], size: float = TICK_FONT) -> float:
    """About the printed width of the longest label at font ``size`` (0.6 em a character)."""
    return max((len(label) for label in labels), default=0) * 0.6 * size / 72


GAP, TOP, BAR = 0.35, 0.65, 1.0  # a head grid's inches: between panels, titles, the colour bar


@dataclass(frozen=True)
class _Grid:
    """A head grid's layout in inches, from the pieces' lengths: a panel per head, ``cols`` to a
    row, the query pieces' labels ``left`` of it and the key pieces' ``below``."""

    cols: int
    rows: int
    panel_w: float
    panel_h: float
    left: float
    below: float

    @classmethod
    def of(
        cls, num_heads: int, query_pieces: list[str], key_pieces: list[str], max_cols: int
    ) -> _Grid:
        cols = min(num_heads, max_cols)
        return cls(
            cols, math.ceil(num_heads / cols), max(1.6, CELL_INCH * len(key_pieces)),
            max(1.6, CELL_INCH * len(query_pieces)), _label_inch(query_pieces) + 0.25,
            _label_inch(key_pieces) + 0.25,
        )  # fmt: skip

    @property
    def width(self) -> float:
        return self.cols * self.panel_w + (self.cols - 1) * GAP

    @property
    def height(self) -> float:
        return self.rows * self.panel_h + (self.rows - 1) * GAP

    @property
    def figure_size(self) -> tuple[float, float]:
        return self.left + self.width + BAR, self.below + self.height + TOP


def grid_inches(
    num_heads: int, query_pieces: list[str], key_pieces: list[str], max_cols: int = 4
) -> tuple[float, float]:
    """The (width, height) in inches of :func:`head_grid`'s figure."""
    return _Grid.of(num_heads, query_pieces, key_pieces, max_cols).figure_size


def head_grid(
    weights: Tensor,
    query_pieces: list[str],
    key_pieces: list[str],
    title: str,
    max_cols: int = 4,
    canvas: tuple[float, float] | None = None,
) -> Figure:
    """weights (H, Tq, Tk) of one layer -> a grid of heads: the key pieces under the last head
    of each column, the query pieces left of the first column. ``canvas``: the figure's (width,
    height) in inches, at least :func:`grid_inches`, with the grid in its top left corner (the
    figures logged under one key share a size: wandb shows them all at the first one's).

    Laid out by hand, in inches, from the pieces' lengths, with ticks on the grid's edges alone:
    matplotlib's automatic layout and a tick per piece on every panel took most of a map's
    rendering time, which runs on the CPU at every map validation, a GPU waiting
    (docs/benchmarks.md#gpu-first-measurements-on-an-h200-2026-11-23).
    """
    num_heads, tq, tk = weights.shape
    g = _Grid.of(num_heads, query_pieces, key_pieces, max_cols)
    width, height = canvas or g.figure_size
    bottom = height - TOP - g.height  # the grid's lower edge
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    fig.subplots_adjust(
        left=g.left / width, right=(g.left + g.width) / width, bottom=bottom / height,
        top=1 - TOP / height, wspace=GAP / g.panel_w, hspace=GAP / g.panel_h,
    )  # fmt: skip
    axes = fig.subplots(g.rows, g.cols, squeeze=False)
    image = None
    for h, ax in enumerate(axes.flat):
        if h >= num_heads:
            ax.axis("off")
            continue
        image = ax.imshow(weights[h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_title(f"head {h}", fontsize=9)
        last_in_column, first_in_row = h + g.cols >= num_heads, h % g.cols == 0
        ax.set_xticks(range(tk) if last_in_column else [], key_pieces if last_in_column else [])
        ax.set_yticks(range(tq) if first_in_row else [], query_pieces if first_in_row else [])
        ax.tick_params(length=0, labelsize=TICK_FONT)
        ax.tick_params(axis="x", labelrotation=90)
    bar = ((g.left + g.width + 0.2) / width, bottom / height, 0.12 / width, g.height / height)
    fig.colorbar(image, cax=fig.add_axes(bar), label="attention weight")
    fig.suptitle(title, x=g.figure_size[0] / 2 / width, fontsize=11)  # over the grid and bar
    return fig


def layer_head_heatmaps(
    panels: dict[str, Tensor], title: str, cmap: str = "viridis", center_zero: bool = False
) -> Figure:
    """One (L, H) heatmap per entry of ``panels`` (e.g. one per statistic), values written in."""
    names = list(panels)
    num_layers, num_heads = next(iter(panels.values())).shape
    cols = min(len(names), 3)
    rows = math.ceil(len(names) / cols)
    panel_w, panel_h = max(2.6, 0.55 * num_heads + 1.2), max(2.0, 0.45 * num_layers + 0.9)
    fig = _figure(cols * panel_w, rows * panel_h + 0.4)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        values = panels[name].float().numpy()
        limits = {}
        if center_zero:
            bound = max(float(abs(values).max()), 1e-9)
            limits = {"vmin": -bound, "vmax": bound}
        image = ax.imshow(values, cmap=cmap, aspect="auto", **limits)
        for layer in range(num_layers):
            for head in range(num_heads):
                ax.text(head, layer, f"{values[layer, head]:.3g}", ha="center", va="center",
                        fontsize=7, color="w", path_effects=OUTLINE)  # fmt: skip
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(num_heads), [f"h{h}" for h in range(num_heads)], fontsize=TICK_FONT)
        ax.set_yticks(range(num_layers), [f"layer {n}" for n in range(num_layers)], fontsize=7)
        fig.colorbar(image, ax=ax, shrink=0.8)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    return fig


def line_plot(x: list[float], y: list[float], xlabel: str, ylabel: str, title: str) -> Figure:
    fig = _figure(4.5, 3.2)
    ax = fig.subplots()
    ax.plot(x, y, marker="o")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    return fig


def save(fig: Figure, path: Path, dpi: int = 90) -> Path:
    """Write ``fig`` as PNG (parents created) and free its canvas."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    fig.clear()
    return path
