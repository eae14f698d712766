"""The router's health on the run page, pure over plain values: a layer-by-expert heatmap of each phase's latest
interval, and the words naming the experts that got no token (their LoRA cannot train)."""

from runs.figures import PHASE_COLOURS, layout, plain
from runs.router_loads import idle_pairs
from runs.run_data import RunData

NO_LOAD = "No router load yet: the trainer reports it every metrics.router_every steps."


def shares(counts: list[list[int]]) -> list[list[float]]:
    """Each layer's counts as shares of that layer's tokens (a layer that got none: all zero)."""
    return [[c / sum(row) if sum(row) else 0.0 for c in row] for row in counts]


def heatmap(phase: int, name: str, step: int, counts: list[list[int]]) -> dict:
    """One phase's latest interval: layers down, experts across, each cell its share of the layer's tokens; the
    experts that got nothing are crossed out."""
    z = shares(counts)
    title = f"Router load · phase {phase} ({name}), interval ending at step {step}"
    idle = idle_pairs(counts)
    traces: list[dict] = [{
        "type": "heatmap", "name": "share of the layer's tokens", "z": [[round(v, 5) for v in row] for row in z],
        "customdata": counts,
        "colorscale": [[0, "#ffffff"], [1, PHASE_COLOURS[phase % len(PHASE_COLOURS)]]], "zmin": 0,
        "colorbar": {"title": {"text": "share"}, "thickness": 10},
        "hovertemplate": "layer %{y}, expert %{x}: %{customdata:,d} tokens, %{z:.2%} of the layer<extra></extra>"}]
    if idle:
        traces.append({"type": "scatter", "mode": "markers", "name": "no token", "x": [e for _, e in idle],
                       "y": [layer for layer, _ in idle], "hovertemplate": "layer %{y}, expert %{x}: no token"
                                                                           "<extra></extra>",
                       "marker": {"symbol": "x-thin", "size": 8, "line": {"width": 1.5, "color": "#b42318"}}})
    return {"id": f"router-load-{phase}", "title": plain(title), "data": traces,
            "layout": layout(plain(title), "MoE layer", hovermode="closest", showlegend=False,
                             height=max(220, min(640, 60 + 12 * len(counts))),
                             # whole layers and experts on the ticks, about a dozen of each at most
                             xaxis={"title": {"text": "routed expert"}, "hoverformat": "d",
                                    "dtick": max(1, len(counts[0]) // 16)},
                             yaxis={"autorange": "reversed", "dtick": max(1, len(counts) // 12)})}


def router_figures(data: RunData) -> list[dict]:
    """A heatmap for every training phase, in phase order; a phase without a reported interval says so."""
    found = []
    for p in data.stats:
        if p.kind == "eval":  # it trains nothing: no router load
            continue
        load = data.router_loads.get(p.index)
        if load is None:
            found.append({"id": f"router-load-{p.index}", "title": plain(f"Router load · phase {p.index} ({p.name})"),
                          "data": [], "layout": layout("", ""), "empty": NO_LOAD})
        else:
            found.append(heatmap(p.index, p.name, *load))
    return found
