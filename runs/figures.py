"""The run page's figures, as Plotly figure dicts (data and layout), built from what runs/run_data.py read. Styling
only: nothing here reads the database. The views encode them with plotly's JSON encoder; the tests check each
against plotly's own figure schema."""

import html
from typing import Any

from runs.downsample import Bucket, envelope, higher, lower, rounded
from runs.phase_stats import PhaseStats, zero_gradient_phases
from runs.projection import STEPS_PER_PRICE, cost_curve
from runs.run_data import ChartInputs, RunData

NO_STEPS = "No steps yet: this chart fills in from the run's first step."
NO_COST = "No cost yet: no box has billed for this run."
# Money axes in plain decimals: plotly's default writes a small amount with an SI suffix ("$30µ").
MONEY_AXIS = {"tickprefix": "$", "tickformat": ",.3~r", "rangemode": "tozero"}
# A log axis labels every tick as a whole number (0.05, 0.1, 0.2) rather than a bare digit beside a power of ten.
LOG_AXIS = {"type": "log", "tickformat": "~g"}

PHASE_COLOURS = ("#2457c5", "#0f8a6c", "#b4690e", "#8e44ad", "#c0392b", "#16a2b8", "#5b6475")


BOX_COLOURS = ("#2457c5", "#d9480f", "#0f8a6c", "#8e44ad", "#b42318", "#16a2b8", "#a15c00")


def plain(text) -> str:
    """Text a host, a marketplace or a recipe wrote, as a hover label shows it: Plotly renders a few tags there
    (<a href> among them) and fills %{...} in templates, so neither may come from them."""
    return html.escape(str(text), quote=False).replace("%{", "%\u200b{")


def layout(title: str, y_title: str, **extra) -> dict:
    layout: dict[str, Any] = {"title": {"text": title, "x": 0, "xanchor": "left", "font": {"size": 14}},
              "margin": {"l": 64, "r": 16, "t": 40, "b": 30}, "height": 300, "uirevision": "keep",
              "paper_bgcolor": "#fff", "plot_bgcolor": "#fff", "hovermode": "x unified",
              "font": {"family": "system-ui, sans-serif", "size": 12, "color": "#1d2330"},
              "legend": {"orientation": "h", "y": -0.12, "yanchor": "top", "font": {"size": 11}},
              # The x axis is the step counted over all phases; the phase lines name where each begins.
              "xaxis": {"gridcolor": "#eef1f5", "zeroline": False, "hoverformat": ",d"},
              "yaxis": {"title": {"text": y_title}, "gridcolor": "#eef1f5", "zeroline": False}}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(layout.get(key), dict):
            layout[key] = {**layout[key], **value}
        else:
            layout[key] = value
    return layout


def _phase_marks(data: RunData) -> list[dict]:
    """Vertical lines where each phase starts, named at the top of the chart."""
    shapes = []
    for p in data.stats:
        x = data.offsets[p.index]
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
                       "line": {"color": "#c3c9d4", "width": 1, "dash": "dot"},
                       "label": {"text": p.name, "textposition": "end", "yanchor": "top", "xanchor": "left",
                                 "font": {"size": 10, "color": "#5b6475"}}})
    return shapes


def _merged(rows: list[dict], name: str, phase: int | None = None, instance: int | None = None) -> list[Bucket]:
    """Buckets of one series, one phase's or one box's; rows of the same bucket on two boxes are merged."""
    merged: dict[tuple, list] = {}
    for r in rows:
        if (phase is not None and r["phase"] != phase) or (instance is not None and r["instance_id"] != instance):
            continue
        low, high = r[f"{name}_low"], r[f"{name}_high"]
        key = (r["phase"], r["bucket"])
        if key not in merged:
            merged[key] = [r["x_first"], r["x_last"], low, high]
            continue
        m = merged[key]
        m[0], m[1] = min(m[0], r["x_first"]), max(m[1], r["x_last"])
        m[2], m[3] = lower(m[2], low), higher(m[3], high)
    return [Bucket(*m) for m in merged.values()]


def _edge(data: RunData, edges: dict, p: PhaseStats, which: str, name: str, instance: int | None = None):
    first, last = p.step_span
    step = first if which == "first" else last
    row = edges.get((p.index, step))
    if row is None or (instance is not None and row["instance_id"] != instance):
        return None
    return data.offsets[p.index] + step, row[name]


def _trace(name: str, xs: list, ys: list, colour: str, **extra) -> dict:
    """A line; its legend name is plain text (a box's label and GPU name come from the marketplace)."""
    return {"type": "scattergl" if len(xs) > 5000 else "scatter", "mode": "lines", "name": plain(name), "x": xs,
            "y": rounded(ys), "line": {"color": colour, "width": 1.6}, **extra}


def _phase_series(data: RunData, rows: list[dict], edges: dict, name: str, p: PhaseStats) -> tuple[list, list]:
    return envelope(_merged(rows, name, phase=p.index), _edge(data, edges, p, "first", name),
                    _edge(data, edges, p, "last", name))


def phase_colour(p: PhaseStats) -> str:
    return PHASE_COLOURS[p.index % len(PHASE_COLOURS)]


def held_out_trace(data: RunData, rows, edges, name: str, p: PhaseStats, label: str, **extra) -> dict | None:
    """A phase's held-out series (eval_*, measured every eval_every steps and at its end) as diamonds joined by a
    dotted line in the phase's colour, beside its training curve; None where it has none."""
    xs, ys = _phase_series(data, rows, edges, name, p)
    if not any(y is not None for y in ys):
        return None
    colour = phase_colour(p)
    return _trace(f"held-out {label} · {p.name}", xs, ys, colour, mode="lines+markers",
                  line={"color": colour, "width": 1.2, "dash": "dot"},
                  marker={"symbol": "diamond", "size": 7, "color": colour}, **extra)


def _per_phase(data: RunData, rows, edges, name, chart_id, title, y_title, held_out: str | None = None,
               **extra) -> dict:
    traces = []
    for p in data.stats:
        if p.points:
            xs, ys = _phase_series(data, rows, edges, name, p)
            traces.append(_trace(f"{p.index} · {p.name}", xs, ys, PHASE_COLOURS[p.index % len(PHASE_COLOURS)]))
            held = held_out_trace(data, rows, edges, held_out, p, name) if held_out else None
            if held:
                traces.append(held)
    return {"id": chart_id, "title": title, "data": traces,
            "layout": layout(title, y_title, shapes=_phase_marks(data), **extra)}


def _per_box(data: RunData, rows, edges, name, chart_id, title, y_title) -> dict:
    traces = []
    for i, (instance_id, box) in enumerate(data.boxes.items()):
        box_rows = [r for r in rows if r["instance_id"] == instance_id]
        if not box_rows:
            continue
        xs, ys = envelope(_merged(box_rows, name))
        traces.append(_trace(box.name, xs, ys, BOX_COLOURS[i % len(BOX_COLOURS)],
                             hovertemplate=f"%{{y:.4g}}<extra>{plain(box.name)} (host {plain(box.machine_id or '?')})"
                                           "</extra>"))
    orphans = [r for r in rows if r["instance_id"] not in data.boxes]
    if orphans:
        xs, ys = envelope(_merged(orphans, name))
        traces.append(_trace("unknown box", xs, ys, "#5b6475"))
    return {"id": chart_id, "title": title, "data": traces,
            "layout": layout(title, y_title, shapes=_phase_marks(data) + _host_changes(data, rows))}


def _host_changes(data: RunData, rows: list[dict]) -> list[dict]:
    """A red line where the run moved to another box (a restart)."""
    seen, shapes = None, []
    for r in rows:
        if seen is not None and r["instance_id"] != seen:
            shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": r["x_first"], "x1": r["x_first"],
                           "y0": 0, "y1": 1, "line": {"color": "#b42318", "width": 1.5},
                           "label": {"text": "host change", "textposition": "start", "yanchor": "bottom",
                                     "xanchor": "left", "font": {"size": 10, "color": "#b42318"}}})
        seen = r["instance_id"]
    return shapes


def _grad_norms(data: RunData, rows, edges) -> dict:
    traces, shapes = [], _phase_marks(data)
    flagged = {p.index for p in data.stats if zero_gradient_phases([p])}
    for p in data.stats:
        if not p.points:
            continue
        colour = PHASE_COLOURS[p.index % len(PHASE_COLOURS)]
        xs, ys = _phase_series(data, rows, edges, "grad_norm_routed", p)
        # A log axis cannot draw 0: the zero stretch is shaded in red instead.
        traces.append(_trace(f"routed · {p.name}", xs, [y if y and y > 0 else None for y in ys], colour))
        xs, ys = _phase_series(data, rows, edges, "grad_norm_attention", p)
        traces.append(_trace(f"attention · {p.name}", xs, [y if y and y > 0 else None for y in ys], colour,
                             line={"color": colour, "width": 1.2, "dash": "dot"}))
        if p.index in flagged:
            first, last = p.step_span
            shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": data.offsets[p.index] + first,
                           "x1": data.offsets[p.index] + last, "y0": 0, "y1": 1,
                           "fillcolor": "rgba(180,35,24,0.10)", "line": {"width": 0},
                           "label": {"text": "routed gradient = 0", "textposition": "middle center",
                                     "font": {"color": "#b42318", "size": 12}}})
    title = "Gradient norms: routed experts (solid) vs attention (dotted)"
    return {"id": "grad-norms", "title": title, "data": traces,
            "layout": layout(title, "LoRA gradient norm", shapes=shapes, yaxis=LOG_AXIS)}


def _b_matrices(data: RunData, rows, edges) -> dict:
    return _solid_and_dashed(data, rows, edges, "b-matrices",
                             "Routed LoRA B: norm (solid) and matrices still at zero (dashed)",
                             ("routed_b_norm", "B norm", "B norm"),
                             ("routed_b_zero", "B at zero", "B matrices at zero"))


def _router(data: RunData, rows, edges) -> dict:
    """The router's balance per phase: the worst layer's busiest expert over its mean (solid; 1 is even) and the
    experts that got no token (dashed), at each logging interval (docs/training.md, "training/router_load.py")."""
    return _solid_and_dashed(data, rows, edges, "router",
                             "Router load: busiest expert over the mean (solid) and experts with no token (dashed)",
                             ("router_max_mean", "max/mean", "max / mean load"),
                             ("router_idle_experts", "idle experts", "experts with no token"), connectgaps=True)


def _solid_and_dashed(data: RunData, rows, edges, chart: str, title: str, solid: tuple, dashed: tuple,
                      **options) -> dict:
    """Two figures per phase in its colour: `solid` on the left axis, `dashed` (a step line) on the right; each is
    (field, trace label, axis title)."""
    traces = []
    for p in data.stats:
        if not p.points:
            continue
        colour = PHASE_COLOURS[p.index % len(PHASE_COLOURS)]
        xs, ys = _phase_series(data, rows, edges, solid[0], p)
        traces.append(_trace(f"{solid[1]} · {p.name}", xs, ys, colour, **options))
        xs, ys = _phase_series(data, rows, edges, dashed[0], p)
        traces.append(_trace(f"{dashed[1]} · {p.name}", xs, ys, colour, yaxis="y2", **options,
                             line={"color": colour, "width": 1.2, "dash": "dash", "shape": "hv"}))
    return {"id": chart, "title": title, "data": traces,
            "layout": layout(title, solid[2], shapes=_phase_marks(data),
                              yaxis2={"title": {"text": dashed[2]}, "overlaying": "y", "side": "right",
                                      "rangemode": "tozero", "showgrid": False},
                              margin={"l": 64, "r": 56})}


def _cost(data: RunData) -> dict:
    times, values = cost_curve(data.segments, data.traffic_usd, data.now)
    traces: list[dict] = [{"type": "scatter", "mode": "lines", "name": "cost so far",
                           "x": [t.isoformat() for t in times], "y": [round(v, 4) for v in values],
                           "line": {"color": "#2457c5", "width": 2}, "fill": "tozeroy",
                           "fillcolor": "rgba(36,87,197,0.08)"}]
    proj = data.projection
    if data.run.is_active and proj.finish_at and proj.total_usd is not None:
        traces.append({"type": "scatter", "mode": "lines", "name": "projected", "x": [data.now.isoformat(),
                                                                                     proj.finish_at.isoformat()],
                       "y": [round(float(data.cost_usd), 4), round(float(proj.total_usd), 4)],
                       "line": {"color": "#2457c5", "width": 2, "dash": "dash"}})
    budget_end = proj.finish_at if data.run.is_active and proj.finish_at else data.now
    start = times[0] if times else data.run.created_at
    highest = max([*values, float(proj.total_usd or 0)], default=0.0)
    traces.append({"type": "scatter", "mode": "lines", "name": "budget", "x": [start.isoformat(),
                                                                                budget_end.isoformat()],
                   "y": [float(data.run.budget_usd)] * 2, "line": {"color": "#b42318", "width": 1, "dash": "dot"},
                   # Far above the spend it would flatten the curve: one click on its legend entry shows it.
                   "visible": True if highest >= 0.4 * float(data.run.budget_usd) else "legendonly"})
    title = "Cumulative cost"
    return {"id": "cost", "title": title, "data": traces,
            "layout": layout(title, "USD", xaxis={"type": "date"}, legend={"y": -0.2}, yaxis=MONEY_AXIS)}


def _cost_per_step(data: RunData, rows: list[dict]) -> dict:
    """Dollars per thousand steps on each box: its hourly price times its mean step time in the bucket (one step
    alone costs fractions of a cent)."""
    traces = []
    for i, (instance_id, box) in enumerate(data.boxes.items()):
        rate = float(box.usd_per_hour) / 3600 * STEPS_PER_PRICE
        points = [(r["x_last"], r["step_s_avg"] * rate) for r in rows
                  if r["instance_id"] == instance_id and r["step_s_avg"] is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            traces.append(_trace(f"$/1k steps · {box.name}", list(xs), list(ys), BOX_COLOURS[i % len(BOX_COLOURS)]))
    title = "Cost per 1k steps"
    return {"id": "cost-per-step", "title": title, "data": traces,
            "layout": layout(title, "USD per 1,000 steps", shapes=_phase_marks(data) + _host_changes(data, rows),
                              yaxis=MONEY_AXIS)}


def _timeline(data: RunData, restarts: list[tuple]) -> dict:
    """Phases and boxes as bars over time, with the moments a host was lost or hung."""
    traces = []
    for p in data.stats:
        if p.first_at is None or p.last_at is None:  # set together, from the phase's first and last point
            continue
        colour = PHASE_COLOURS[p.index % len(PHASE_COLOURS)]
        traces.append({"type": "scatter", "mode": "lines", "name": plain(f"phase {p.index} · {p.name}"),
                       "x": [p.first_at.isoformat(), p.last_at.isoformat()], "y": ["phases", "phases"],
                       "line": {"color": colour, "width": 18},
                       "hovertemplate": f"{plain(p.name)} ({p.kind}): steps {p.first_step}–{p.last_step}"
                                        "<extra></extra>"})
    for i, box in enumerate(data.boxes.values()):
        if box.started_at is None:
            continue
        end = box.ended_at or data.now
        traces.append({"type": "scatter", "mode": "lines", "name": plain(f"box · {box.name}"),
                       "x": [box.started_at.isoformat(), end.isoformat()], "y": ["boxes", "boxes"],
                       "line": {"color": BOX_COLOURS[i % len(BOX_COLOURS)], "width": 18},
                       "hovertemplate": f"{plain(box.name)}, host {plain(box.machine_id or '?')}: "
                                        f"{plain(box.end_reason or 'running')}<extra></extra>"})
    if restarts:
        traces.append({"type": "scatter", "mode": "markers", "name": "host lost / hung",
                       "x": [at.isoformat() for at, _, _ in restarts], "y": ["boxes"] * len(restarts),
                       "text": [plain(f"{kind}: {message}") for _, kind, message in restarts],
                       "hovertemplate": "%{text}<extra></extra>",
                       "marker": {"symbol": "x", "size": 13, "color": "#b42318", "line": {"width": 2}}})
    title = "Timeline: phases, boxes and restarts"
    return {"id": "timeline", "title": title, "data": traces,
            "layout": layout(title, "", height=190, hovermode="closest", showlegend=False,
                              xaxis={"title": {"text": "time (UTC)"}, "type": "date"},
                              yaxis={"title": {"text": ""}, "categoryorder": "array",
                                     "categoryarray": ["boxes", "phases"]})}


def _said_empty(figure: dict, empty: bool, why: str) -> dict:
    """A chart with nothing to draw says so in words (the page shows them instead of an empty plot, whose axes
    would otherwise span a meaningless default range)."""
    return {**figure, "empty": why} if empty else figure


def run_figures(inputs: ChartInputs) -> list[dict]:
    """Every chart of the run page, in the order the page shows them."""
    data, rows, edges = inputs.data, inputs.rows, inputs.edges
    no_steps = inputs.points == 0
    timeline = _timeline(data, inputs.restarts)
    step_charts = [
        _per_box(data, rows, edges, "step_s", "step-time", "Step time by box", "seconds per step"),
        _per_phase(data, rows, edges, "loss", "loss", "Loss per phase (held-out: diamonds)", "loss",
                   held_out="eval_loss"),
        _grad_norms(data, rows, edges),
        _b_matrices(data, rows, edges),
        _per_box(data, rows, edges, "tokens_per_s", "tokens", "Tokens per second by box", "tokens/s"),
        _router(data, rows, edges),
    ]
    return [
        _said_empty(timeline, not timeline["data"], NO_STEPS),
        *(_said_empty(f, no_steps, NO_STEPS) for f in step_charts),
        _said_empty(_cost(data), not data.segments, NO_COST),
        _said_empty(_cost_per_step(data, rows), no_steps, NO_STEPS),
    ]
