"""The experiments' figures, drawn with matplotlib (installed with requirements-test.txt) into PNG files: grouped bars,
lines against a sweep, and a grid as a heat map. Every figure says in its title or axis whether its figures were
measured or modelled."""

from __future__ import annotations

from pathlib import Path

from ..suites_figures import _pyplot, _save  # BENCHMARKS.md's own: the same style, Agg, files only


def grouped_bars(path: Path, groups: list[str], values: dict[str, list[float]], ylabel: str, title: str,
                 hline: float | None = None) -> None:
    """One group of bars per entry of `groups`, one bar per series of `values` (series -> a value per group)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    width = 0.8 / max(1, len(values))
    for i, (name, ys) in enumerate(values.items()):
        ax.bar([g + i * width for g in range(len(groups))], ys, width, label=name)
    ax.set_xticks([g + width * (len(values) - 1) / 2 for g in range(len(groups))], groups)
    if hline is not None:
        ax.axhline(hline, color="grey", lw=0.8, ls="--")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(frameon=False, fontsize=7, ncol=2)
    _save(plt, fig, path)


def lines(path: Path, panels: list[tuple[str, str, dict[str, tuple[list, list]]]], xlabel: str, title: str,
          hline: float | None = None, xlog: bool = False) -> None:
    """Side-by-side panels, each (ylabel, panel title, {series: (xs, ys)}), sharing the x axis's meaning."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.8 * len(panels), 3.3), squeeze=False)
    for ax, (ylabel, sub, series) in zip(axes[0], panels):
        for name, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="o", ms=3, label=name)
        if hline is not None:
            ax.axhline(hline, color="grey", lw=0.8, ls="--")
        if xlog:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(sub, fontsize=9)
        ax.legend(frameon=False, fontsize=7)
    fig.suptitle(title, fontsize=9)
    _save(plt, fig, path)


def heatmaps(path: Path, panels: list[tuple[str, list, list, list[list[float | None]]]], xlabel: str, ylabel: str,
             title: str, digits: int = 2) -> None:
    """Side-by-side grids, each (panel title, xs, ys, values[y][x]), every cell written in."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (sub, xs, ys, grid) in zip(axes[0], panels):
        shown = [[float("nan") if v is None else v for v in row] for row in grid]
        im = ax.imshow(shown, origin="lower", aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        ax.set_yticks(range(len(ys)), [str(y) for y in ys])
        filled = [v for row in grid for v in row if v is not None]
        middle = (min(filled) + max(filled)) / 2 if filled else 0.0
        for yi, row in enumerate(grid):
            for xi, v in enumerate(row):
                if v is not None:  # dark text on the bright half of viridis, white on the dark half
                    ax.text(xi, yi, f"{v:.{digits}f}", ha="center", va="center", fontsize=7,
                            color="black" if v > middle else "white")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(sub, fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(title, fontsize=9)
    _save(plt, fig, path)
