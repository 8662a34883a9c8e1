"""PNG plots (matplotlib, Agg): an A/B report's per-pass waterfall and on/off bars, a sweep's latency per axis."""
from __future__ import annotations

import re
from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def waterfall(case, out_dir) -> str | None:
    """Cumulative steps of the default pipeline (step:N variants): all-off, then each pass's Δ."""
    steps = [(name, r) for name, r in case.results.items() if r.variant.kind == "step"]
    if "all-off" not in case.results or "default" not in case.results or not steps:
        return None
    plt = _plt()
    labels, deltas, bottoms = ["all-off"], [], []
    level = case.latency("all-off")
    values = [level]
    for _name, r in steps:
        labels.append(r.variant.pass_name)
        deltas.append(r.latency_us - level)
        bottoms.append(min(level, r.latency_us))
        level = r.latency_us
        values.append(level)
    labels.append("default")
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(labels) + 2), 4.5))
    ax.bar(0, values[0], color="#7f8c8d")
    span = max(values) - min(values + [case.latency("default")])
    for i, (d, b) in enumerate(zip(deltas, bottoms), start=1):
        color = "#27ae60" if d < 0 else "#c0392b" if d > 0 else "#95a5a6"
        ax.bar(i, abs(d) if d else max(span, 1.0) * 0.01, bottom=b, color=color)
        if d:
            ax.text(i, b + abs(d), f"{d:+.0f}", ha="center", va="bottom", fontsize=7)
    ax.bar(len(labels) - 1, case.latency("default"), color="#2980b9")
    top, low = max(values), min(values + [case.latency("default")])
    if top > 0 and (top - low) / top < 0.2:           # small steps: zoom in (the axis does not start at 0)
        ax.set_ylim(low - 0.5 * max(top - low, top * 0.01), top + 0.15 * max(top - low, top * 0.01))
        ax.text(0.01, 0.98, "y axis does not start at 0", transform=ax.transAxes, fontsize=7, va="top")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("estimated latency (µs)")
    ax.set_title(f"{case.case.label()}: per-pass waterfall (cumulative pipeline prefixes)", fontsize=9)
    fig.tight_layout()
    path = Path(out_dir) / f"waterfall_{_slug(case.case.layer)}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def onoff_bars(report, out_dir) -> str | None:
    """All-off vs default (and leave-one-out) latency per case."""
    if not report.cases:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(report.cases), figsize=(4.5 * len(report.cases), 4.5), squeeze=False)
    for ax, case in zip(axes[0], report.cases):
        shown = ("off", "none", "default", "loo", "cleanup", "pipeline")
        names = [n for n, r in case.results.items() if r.variant.kind in shown]
        values = [case.latency(n) for n in names]
        colors = ["#7f8c8d" if n == "all-off" else "#2980b9" if n == "default" else "#bdc3c7" for n in names]
        ax.bar(range(len(names)), values, color=colors)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=55, ha="right", fontsize=7)
        d = case.results.get("default")
        if d is not None:
            ax.axhline(d.estimate.bound_us, color="#e67e22", linestyle="--", linewidth=1)
            ax.text(len(names) - 0.5, d.estimate.bound_us, " roofline", color="#e67e22", fontsize=7, va="bottom",
                    ha="right")
        ax.set_ylabel("estimated latency (µs)")
        imp = case.improvement
        ax.set_title(f"{case.case.layer}: default {imp:+.1f} % vs all-off" if imp is not None else case.case.layer,
                     fontsize=9)
    fig.tight_layout()
    path = Path(out_dir) / "onoff.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def sweep_plots(report, out_dir) -> list[str]:
    """Per layer and swept axis: latency against the axis, one line per pipeline (and per value of the other swept
    axes, when there are any), `sweep_<layer>_<axis>.png`."""
    written = []
    swept = report.swept()
    for layer in dict.fromkeys(p.layer for p in report.points):
        points = [p for p in report.points if p.layer == layer and p in report.results]
        for axis in swept:
            values = [v for v in dict.fromkeys(p.axes().get(axis) for p in points) if v is not None]
            if len(values) < 2:
                continue
            lines: dict[tuple, list] = {}
            for p in points:
                others = tuple((k, v) for k, v in p.axes().items() if k != axis and k in swept and v is not None)
                lines.setdefault((p.pipeline, others), []).append((p.axes().get(axis), report.results[p]["latency_us"]))
            path = _axis_plot(layer, axis, values, lines, out_dir)
            if path:
                written.append(path)
    return written


def _axis_plot(layer: str, axis: str, values: list, lines: dict, out_dir) -> str | None:
    plt = _plt()
    numeric = all(isinstance(v, (int, float)) for v in values)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    pipelines = list(dict.fromkeys(pipeline for pipeline, _ in lines))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    variants = list(dict.fromkeys(others for _, others in lines))
    for (pipeline, others), pts in lines.items():
        pts = [(x if numeric else values.index(x), y) for x, y in pts]
        pts.sort()
        label = pipeline + (" · " + ", ".join(f"{k}={v}" for k, v in others) if others else "")
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=4,
                color=colors[pipelines.index(pipeline) % len(colors)],
                linestyle=styles[variants.index(others) % len(styles)], label=label)
    if numeric and max(values) / max(min(values), 1) >= 8:
        ax.set_xscale("log", base=2)
    if numeric:
        ax.set_xticks(values)
        ax.set_xticklabels([str(v) for v in values], fontsize=8)
        ax.minorticks_off()
    else:
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels([str(v) for v in values], fontsize=8)
    ax.set_xlabel(axis)
    ax.set_ylabel("estimated latency (µs)")
    ax.set_title(f"{layer}: latency against {axis}", fontsize=9)
    ax.legend(fontsize=7, ncol=1 if len(lines) <= 8 else 2)
    fig.tight_layout()
    path = Path(out_dir) / f"sweep_{_slug(layer)}_{_slug(axis)}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
