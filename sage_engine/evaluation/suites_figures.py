"""BENCHMARKS.md's figures, drawn from the suites' bench reports with matplotlib (a test dependency, like the report's
suites): the speedup of each policy on each suite, tau against tokens/s, how deep accepted paths reach, SAGE's alpha
against what a step accepts, and the speedups under sampling. `render(reports, folder)` writes them as PNG files and
returns (title, file) pairs for the markdown."""

from __future__ import annotations

from pathlib import Path

SUITES = ("tinyworld-images", "tinyworld-clips", "real")
SKIP = ("ar",)  # the reference: speedup 1 by definition


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
    return plt


def _save(plt, fig, path: Path, legend_ax=None, legend_size: int = 7) -> None:
    """The figure written to `path` (with its axes' legend, where it has one) and closed."""
    if legend_ax is not None:
        legend_ax.legend(frameon=False, fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _greedy(reports: dict[str, dict]) -> dict[str, dict]:
    return {s: reports[s] for s in SUITES if s in reports}


def speedup(reports: dict[str, dict], path: Path) -> None:
    """Grouped bars: each policy's speedup vs `ar` on each greedy suite."""
    plt = _pyplot()
    suites = _greedy(reports)
    policies = [p for p in dict.fromkeys(p for r in suites.values() for p in r["policies"]) if p not in SKIP]
    fig, ax = plt.subplots(figsize=(8.5, 3.4))
    width = 0.8 / max(1, len(suites))
    for i, (name, report) in enumerate(suites.items()):
        values = [(report["policies"].get(p) or {}).get("speedup_vs_ar") or 0.0 for p in policies]
        ax.bar([k + i * width for k in range(len(policies))], values, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([k + width * (len(suites) - 1) / 2 for k in range(len(policies))])
    ax.set_xticklabels([p.replace(":", ":\n", 1) for p in policies], fontsize=7)
    ax.set_ylabel("speedup vs ar (tokens/s)")
    _save(plt, fig, path, ax, 7)


def tau_and_rate(reports: dict[str, dict], path: Path) -> None:
    """Tau against tokens/s, one panel per greedy suite: a deeper accepted path pays only where a step stays cheap."""
    plt = _pyplot()
    suites = _greedy(reports)
    fig, axes = plt.subplots(1, len(suites), figsize=(9, 3.2), squeeze=False)
    for ax, (name, report) in zip(axes[0], suites.items()):
        for policy, agg in report["policies"].items():
            ax.scatter(agg["mean_accepted"], agg["tokens_per_second"], s=18)
            ax.annotate(policy.split(":")[0] if policy.count(":") < 2 else "sage (paper)",
                        (agg["mean_accepted"], agg["tokens_per_second"]), fontsize=6, xytext=(3, 2),
                        textcoords="offset points")
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("tau (tokens per target forward)")
    axes[0][0].set_ylabel("tokens/s")
    _save(plt, fig, path)


def accepted_depth(reports: dict[str, dict], path: Path) -> None:
    """How often the accepted path reaches depth l given the tree does, per tree policy, on the fresh images."""
    plt = _pyplot()
    report = reports.get(SUITES[0]) or next(iter(reports.values()))
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for policy, agg in report["policies"].items():
        rates = agg.get("accepted_by_depth") or []
        if rates:
            ax.plot(range(1, len(rates) + 1), rates, marker="o", markersize=3, label=policy)
    ax.set_xlabel("depth l")
    ax.set_ylabel("P(accepted path reaches l | tree does)")
    ax.set_ylim(0, 1.02)
    _save(plt, fig, path, ax, 6)


def alpha_accepted(reports: dict[str, dict], path: Path, policy: str = "sage") -> None:
    """SAGE's premise: mean accepted draft tokens of a step against its root's alpha, per greedy suite (points sized by
    the steps behind them)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for i, (name, report) in enumerate(_greedy(reports).items()):
        bins = ((report["policies"].get(policy) or {}).get("premise") or {}).get("by_alpha") or []
        points = [((b + 0.5) / 10, mean, n) for b, (mean, n) in enumerate(bins) if n >= 3]  # 3+ steps a point
        if points:
            xs, ys, ns = zip(*points)
            ax.plot(xs, ys, linewidth=0.8, color=f"C{i}")
            ax.scatter(xs, ys, s=[8 + 60 * n / max(ns) for n in ns], label=name, color=f"C{i}")
    ax.set_xlabel(f"alpha of the step's root ({policy})")
    ax.set_ylabel("accepted draft tokens per step")
    _save(plt, fig, path, ax, 7)


def sampled(reports: dict[str, dict], path: Path) -> None:
    """Each policy's speedup vs `ar` at each temperature of the sampled suite (0: greedy)."""
    plt = _pyplot()
    runs = {0.0: reports[SUITES[0]]} if SUITES[0] in reports else {}
    runs.update({r["sampling"]["temperature"]: r for r in reports.values() if r.get("sampling")})
    temps = sorted(runs)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    policies = [p for p in dict.fromkeys(p for r in runs.values() for p in r["policies"]) if p not in SKIP]
    for policy in policies:
        points = [(t, runs[t]["policies"][policy].get("speedup_vs_ar")) for t in temps if policy in runs[t]["policies"]]
        points = [(t, v) for t, v in points if v]
        if len(points) > 1:
            ax.plot(*zip(*points), marker="o", markersize=3, label=policy)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("temperature")
    ax.set_ylabel("speedup vs ar")
    _save(plt, fig, path, ax, 6)


FIGURES = (("Speedup over `ar` per policy and suite", "speedup.png", speedup),
           ("Tau against tokens/s", "tau-tokens.png", tau_and_rate),
           ("How deep accepted paths reach (fresh images)", "accepted-depth.png", accepted_depth),
           ("Does alpha predict the accepted length? (`sage`)", "alpha-accepted.png", alpha_accepted),
           ("Speedup under sampling (fresh images)", "sampled.png", sampled))


def render(reports: dict[str, dict], folder: Path) -> list[tuple[str, Path]]:
    """Every figure whose data the reports hold, as PNG files in `folder`: (title, file) pairs."""
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    for title, name, draw in FIGURES:
        if draw is sampled and not any(r.get("sampling") for r in reports.values()):
            continue
        if draw is alpha_accepted and not any(((r["policies"].get("sage") or {}).get("premise") or {}).get("by_alpha")
                                               for r in reports.values()):
            continue  # reports from before the premise's alpha bins
        draw(reports, folder / name)
        made.append((title, folder / name))
    return made
