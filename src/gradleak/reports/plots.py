"""The report's plots, as inline SVG (no files, no network at view time): ROUGE-2 and the
exact rate against every numeric axis of the grid (batch size, local epochs, a defense's
strength), one line per combination of the other axes."""

from __future__ import annotations

import io
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from gradleak.reports.data import CellReport

# "noise:sigma=0.01", "dpsgd:clip=1.0,sigma=0.5": a defense's parameters
_PARAMETER = re.compile(r"([a-z_]+)=([-+0-9.eE]+)")


@dataclass(frozen=True)
class Plot:
    title: str
    svg: str


def numeric_axes(cells: list[CellReport]) -> dict[str, dict[str, float]]:
    """Each label that is a number in every cell (or a defense whose one varying parameter
    is), as {cell name: x}; only labels with at least two distinct values."""
    keys = list(dict.fromkeys(k for c in cells for k in c.labels))
    axes: dict[str, dict[str, float]] = {}
    for key in keys:
        values = {c.name: c.labels.get(key) for c in cells}
        if key == "defense":
            named = _defense_strength(values)
            if named is not None:
                axes[named[0]] = named[1]
            continue
        try:
            xs = {name: float(v) for name, v in values.items() if not isinstance(v, bool)}
        except (TypeError, ValueError):
            continue
        if len(xs) == len(values) and len(set(xs.values())) >= 2:
            axes[key] = xs
    return axes


def _defense_strength(values: dict[str, Any]) -> tuple[str, dict[str, float]] | None:
    """A defense axis as numbers: the one parameter that varies (no defense: 0)."""
    parameters: dict[str, dict[str, float]] = {}
    for name, value in values.items():
        text = str(value)
        parameters[name] = (
            {} if text == "none" else {k: float(v) for k, v in _PARAMETER.findall(text)}
        )
    kinds = {str(v).split(":")[0] for v in values.values() if str(v) != "none"}
    varying = {k for p in parameters.values() for k in p}
    varying = {k for k in varying if len({p.get(k) for p in parameters.values()}) > 1}
    if len(kinds) != 1 or len(varying) != 1:
        return None
    key = varying.pop()
    xs = {name: p.get(key, 0.0) for name, p in parameters.items()}
    return (f"defense {kinds.pop()} {key}", xs) if len(set(xs.values())) >= 2 else None


def plots(cells: list[CellReport]) -> list[Plot]:
    """ROUGE-2 and exact % against each numeric axis (cells with scores only), then against
    utility where the experiment measured it."""
    scored = [c for c in cells if c.metrics.strict is not None]
    out = []
    for axis, xs in numeric_axes(scored).items():
        lines: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        label_key = "defense" if axis.startswith("defense ") else axis
        for cell in scored:
            others = ", ".join(f"{k}={v}" for k, v in cell.labels.items() if k != label_key)
            strict = cell.metrics.strict
            lines[others or cell.config.attack.name].append(
                (xs[cell.name], strict.rouge2, strict.exact_match)
            )
        out.append(Plot(f"ROUGE-2 and exact sentences against {axis}", _svg(axis, lines)))
    tradeoff = privacy_against_utility(scored)
    if tradeoff is not None:
        out.append(tradeoff)
    return out


def privacy_against_utility(cells: list[CellReport]) -> Plot | None:
    """Each attack's ROUGE-2 and exact rate against its scenario's utility after
    fine-tuning (accuracy, or perplexity for LMs): one line per attack, a point per
    scenario; None unless the experiment measured two scenarios or more."""
    lines: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    metric = ""
    for cell in cells:
        utility, strict = cell.utility, cell.metrics.strict
        if utility is None or strict is None:
            continue
        metric = utility.metric
        point = (utility.after[metric], strict.rouge2, strict.exact_match)
        lines[cell.config.attack.name].append(point)
    if len({x for points in lines.values() for x, _, _ in points}) < 2:
        return None
    axis = f"dev {metric} after fine-tuning"
    return Plot(f"Privacy against utility: ROUGE-2 and exact sentences against {axis}",
                _svg(axis, lines, ticks=False))  # fmt: skip


def _svg(axis: str, lines: dict[str, list[tuple[float, float, float]]], ticks: bool = True) -> str:
    """Two panels (ROUGE-2, exact %) of ``lines``; ``ticks``: at the grid's values."""
    figure, panels = _pyplot().subplots(1, 2, figsize=(9, 3.4))
    for label, points in lines.items():
        points.sort()
        x = [p[0] for p in points]
        panels[0].plot(x, [p[1] for p in points], marker="o", label=label)
        panels[1].plot(x, [p[2] for p in points], marker="o", label=label)
    for panel, metric in zip(panels, ("ROUGE-2 (strict)", "exact sentences %"), strict=True):
        panel.set_xlabel(axis)
        panel.set_ylabel(metric)
        panel.set_ylim(-2, 102)
        panel.grid(alpha=0.3)
        xs = sorted({p[0] for points in lines.values() for p in points})
        if ticks and xs and xs[0] > 0 and xs[-1] / xs[0] >= 20:
            panel.set_xscale("log")
        if ticks:
            panel.set_xticks(xs, [f"{x:g}" for x in xs])  # the grid's values, not a scale's
    panels[1].legend(fontsize=7, loc="best")
    return _inline(figure)


def epsilon_by_round(rounds: list[dict[str, Any]]) -> Plot | None:
    """The measured epsilon of each round's canaries (both one-run bounds for each kind, and
    the most as many canaries could show); None where no round measured one."""
    ceiling = sorted({(r["round"], p["ceiling"]) for r in rounds
                      for p in (r.get("privacy") or {}).values() if p})  # fmt: skip
    if not ceiling:
        return None
    scorings = list(dict.fromkeys(k for r in rounds for k in (r.get("privacy") or {})))
    figure, panel = _pyplot().subplots(figsize=(6, 3.2))
    ticks: set[int] = set()
    for scoring in scorings:
        measured = [(r["round"], r["privacy"][scoring]) for r in rounds
                    if (r.get("privacy") or {}).get(scoring)]  # fmt: skip
        x = [r for r, _ in measured]
        ticks.update(x)
        panel.plot(x, [p["gdp_epsilon"] for _, p in measured], "o-", label=f"{scoring}: GDP")
        panel.plot(x, [p["epsilon"] for _, p in measured], "s-", label=f"{scoring}: (eps, delta)")
    panel.plot(*zip(*ceiling, strict=True), "k--", label="most as many canaries show")
    panel.set_xlabel("round")
    panel.set_ylabel("epsilon (lower bound, 95%)")
    panel.set_xticks(sorted(ticks), [str(r) for r in sorted(ticks)])
    panel.set_ylim(bottom=0)
    panel.grid(alpha=0.3)
    panel.legend(fontsize=7, loc="best")
    return Plot("Measured epsilon per round (canaries)", _inline(figure))


def _pyplot() -> Any:
    """matplotlib's pyplot on its file-only backend (imported here: reports without plots
    never load it)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def _inline(figure: Any) -> str:
    """``figure`` as inline SVG (no XML prolog, no metadata), and closed."""
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    _pyplot().close(figure)
    text = buffer.getvalue()
    text = text[text.index("<svg") :]  # the XML prolog and doctype do not belong inline
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.DOTALL)
