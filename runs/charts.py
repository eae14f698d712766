"""What a run's charts show: per-phase series downsampled in the database, the zero-gradient check, cost and
projections. The pure parts (bucket widths, envelopes, the zero-gradient rule, projections, the cost curve) take
plain values; `run_charts` is the one function that reads the database, with a fixed number of lean queries.

Downsampling is min/max per bucket: steps are grouped into buckets of equal width in SQL, and each bucket gives its
smallest and largest value, so a spike or a zero never disappears, and a chart never carries more than about
2 x MAX_BUCKETS points whatever the run's length. The first and last point of every phase are kept exactly."""

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal

from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import Avg, Count, ExpressionWrapper, F, IntegerField, Max, Min, OuterRef, Q, Subquery, Value

from fleet.instances import ledger
from fleet.models import CostSegment
from runs.models import MetricPoint, Run, RunEvent
from training import metric_fields

MAX_BUCKETS = 1000  # over the whole run; each bucket gives at most two points per series
SETTLED_CACHE_S = 600  # buckets of phases a run has left behind, kept this long
ENVELOPED = metric_fields.ENVELOPED
CSV_COLUMNS = (metric_fields.PHASE, metric_fields.STEP, metric_fields.AT, *metric_fields.NAMES, "instance__label",
               "instance__gpu_name")
RESTART_EVENTS = ("host_lost", "hung", "probe_failed")
PHASE_COLOURS = ("#2457c5", "#0f8a6c", "#b4690e", "#8e44ad", "#c0392b", "#16a2b8", "#5b6475")
BOX_COLOURS = ("#2457c5", "#d9480f", "#0f8a6c", "#8e44ad", "#b42318", "#16a2b8", "#a15c00")


# --- pure parts ---------------------------------------------------------------------------------------------------

def bucket_width(points: int, max_buckets: int = MAX_BUCKETS) -> int:
    """Steps per bucket so that `points` steps make at most `max_buckets` buckets."""
    return max(1, math.ceil(points / max_buckets))


@dataclass(frozen=True)
class Bucket:
    x_first: float
    x_last: float
    low: float | None
    high: float | None


def envelope(buckets: list[Bucket], first: tuple | None = None, last: tuple | None = None) -> tuple[list, list]:
    """Points (xs, ys) through every bucket's minimum and maximum, ordered along the trend so that a smooth series
    draws as a clean line and a noisy one as its band; `first` and `last` (x, y) are kept exactly."""
    kept = [b for b in buckets if b.low is not None]
    xs, ys = [], []
    if first is not None and first[1] is not None:
        xs.append(first[0]), ys.append(first[1])
    for i, b in enumerate(kept):
        if b.low == b.high or b.x_first == b.x_last:
            xs.append(b.x_last if b.x_first == b.x_last else (b.x_first + b.x_last) / 2), ys.append(b.high)
            continue
        here = (b.low + b.high) / 2
        if i + 1 < len(kept):
            rising = (kept[i + 1].low + kept[i + 1].high) / 2 >= here
        else:
            rising = i == 0 or here >= (kept[i - 1].low + kept[i - 1].high) / 2
        a, z = (b.low, b.high) if rising else (b.high, b.low)
        xs.extend((b.x_first, b.x_last)), ys.extend((a, z))
    if last is not None and last[1] is not None and (not xs or xs[-1] != last[0] or ys[-1] != last[1]):
        if xs and xs[-1] >= last[0]:  # the last bucket already ends there: its exact value goes last
            while xs and xs[-1] >= last[0]:
                xs.pop(), ys.pop()
        xs.append(last[0]), ys.append(last[1])
    return xs, ys


@dataclass(frozen=True)
class PhaseStats:
    index: int
    name: str
    kind: str
    planned_steps: int
    points: int = 0
    first_step: int | None = None
    last_step: int | None = None
    first_at: datetime | None = None
    last_at: datetime | None = None
    routed_grad_points: int = 0
    max_grad_routed: float | None = None
    b_zero_points: int = 0
    min_b_zero: int | None = None
    max_b_zero: int | None = None


def zero_gradient_phases(stats: list[PhaseStats]) -> list[str]:
    """Why each phase that trained with the routed-expert LoRA's gradient at zero is suspect, in the user's words:
    its routed gradient norm was exactly 0 at every step, or its count of routed B matrices still at zero never
    moved from a first value above 0 (B starts at zero and any gradient moves it)."""
    found = []
    for p in stats:
        label = f"Phase {p.index} ({p.name})"
        if p.routed_grad_points and p.max_grad_routed == 0:
            found.append(f"{label}: the routed-expert LoRA gradient norm is exactly 0 at all "
                         f"{p.routed_grad_points} steps reported; the routed experts are not training.")
        elif p.b_zero_points >= 2 and p.min_b_zero == p.max_b_zero and (p.min_b_zero or 0) > 0:
            found.append(f"{label}: {p.min_b_zero} routed LoRA B matrices stayed at zero through "
                         f"{p.b_zero_points} steps; the routed experts get no gradient.")
    return found


@dataclass(frozen=True)
class Projection:
    steps_done: int
    steps_total: int
    step_s: float | None
    usd_per_step: Decimal | None
    finish_at: datetime | None
    total_usd: Decimal | None

    @property
    def percent(self) -> float:
        return 100.0 * self.steps_done / self.steps_total if self.steps_total else 0.0


def steps_done(planned: list[int], current_phase: int, current_step: int) -> int:
    """Steps trained so far: every earlier phase in full, plus the current one's."""
    return sum(planned[:current_phase]) + min(current_step, planned[current_phase] if current_phase < len(planned)
                                              else current_step)


def project(*, planned: list[int], current_phase: int, current_step: int, step_s: float | None,
            usd_per_hour: Decimal | None, cost_usd: Decimal, now: datetime, active: bool,
            finished_at: datetime | None = None) -> Projection:
    """When the run ends and what it costs by then, at its recent step time on its current box's price. An ended
    run's projection is what happened; a run with no step time yet projects nothing."""
    total = sum(planned)
    done = total if (not active and finished_at and current_phase >= len(planned) - 1
                     and current_step >= (planned[-1] if planned else 0)) else steps_done(planned, current_phase,
                                                                                       current_step)
    per_step = None
    if step_s is not None and usd_per_hour is not None:
        per_step = usd_per_hour * Decimal(str(step_s)) / ledger.SECONDS_PER_HOUR
    if not active:
        return Projection(done, total, step_s, per_step, finished_at, cost_usd)
    if step_s is None or usd_per_hour is None:
        return Projection(done, total, step_s, per_step, None, None)
    remaining_s = max(0, total - done) * step_s
    return Projection(done, total, step_s, per_step, now + timedelta(seconds=remaining_s),
                      cost_usd + usd_per_hour * Decimal(str(remaining_s)) / ledger.SECONDS_PER_HOUR)


def cost_curve(segments: list[tuple], traffic_usd: Decimal, now: datetime) -> tuple[list[datetime], list[float]]:
    """The run's cumulative cost over time from its boxes' cost segments (usd_per_hour, started_at, ended_at): exact,
    since the cost is linear between segment boundaries. Traffic is billed in the first point."""
    times = sorted({t for _, start, end in segments for t in (start, end or now) if t <= now} | ({now} if segments
                                                                                              else set()))
    values = [float(traffic_usd + ledger.cost_in_window(segments, None, t)) for t in times]
    return times, values


# --- reading the database -----------------------------------------------------------------------------------------

def phase_stats(phases: list[tuple], rows: list[dict]) -> list[PhaseStats]:
    """Per-phase counts and the zero-gradient figures, folded from the bucket rows of `bucket_rows` (so the run's
    points are scanned once). `phases` are (index, name, kind, planned steps)."""
    folded: dict[int, dict] = {}
    for r in rows:
        f = folded.get(r["phase"])
        if f is None:
            folded[r["phase"]] = {"points": r["points"], "first_step": r["x_first"], "last_step": r["x_last"],
                                  "routed_grad_points": r["grad_norm_routed_points"],
                                  "max_grad_routed": r["grad_norm_routed_high"],
                                  "b_zero_points": r["routed_b_zero_points"], "min_b_zero": r["routed_b_zero_low"],
                                  "max_b_zero": r["routed_b_zero_high"]}
            continue
        f["points"] += r["points"]
        f["first_step"], f["last_step"] = min(f["first_step"], r["x_first"]), max(f["last_step"], r["x_last"])
        f["routed_grad_points"] += r["grad_norm_routed_points"]
        f["b_zero_points"] += r["routed_b_zero_points"]
        f["max_grad_routed"] = _max(f["max_grad_routed"], r["grad_norm_routed_high"])
        f["min_b_zero"] = _min(f["min_b_zero"], r["routed_b_zero_low"])
        f["max_b_zero"] = _max(f["max_b_zero"], r["routed_b_zero_high"])
    stats = [PhaseStats(index=i, name=n, kind=k, planned_steps=steps, **folded.pop(i, {})) for i, n, k, steps in phases]
    # Points of a phase the run does not list (a recipe edited by hand) still show.
    stats += [PhaseStats(index=i, name=f"phase {i}", kind="", planned_steps=f["last_step"], **f)
              for i, f in sorted(folded.items())]
    return stats


def _min(a, b):
    return b if a is None else a if b is None else min(a, b)


def _max(a, b):
    return b if a is None else a if b is None else max(a, b)


@dataclass
class Box:
    instance_id: int
    label: str
    gpu: str
    machine_id: str
    usd_per_hour: Decimal
    started_at: datetime | None = None
    ended_at: datetime | None = None
    end_reason: str = ""

    @property
    def name(self) -> str:
        return f"{self.gpu} · {self.label or self.instance_id}"


@dataclass
class RunData:
    run: Run
    now: datetime
    stats: list[PhaseStats]
    boxes: dict[int, Box]
    cost_usd: Decimal
    projection: Projection
    warnings: list[str]
    segments: list[tuple] = field(default_factory=list)
    traffic_usd: Decimal = Decimal(0)
    offsets: dict[int, int] = field(default_factory=dict)


def _boxes(run: Run) -> tuple[dict[int, Box], list[tuple], Decimal]:
    boxes, traffic = {}, {}
    for a in run.attempts.values("instance_id", "instance__label", "instance__num_gpus", "instance__gpu_name",
                                 "instance__machine_id", "instance__usd_per_hour", "instance__traffic_usd",
                                 "started_at", "ended_at", "end_reason"):
        gpu = f"{a['instance__num_gpus']}× {a['instance__gpu_name']}"
        boxes[a["instance_id"]] = Box(a["instance_id"], a["instance__label"], gpu, a["instance__machine_id"],
                                      a["instance__usd_per_hour"], a["started_at"], a["ended_at"], a["end_reason"])
        traffic[a["instance_id"]] = a["instance__traffic_usd"]
    segments = list(CostSegment.objects.filter(instance_id__in=list(boxes))
                    .values_list("usd_per_hour", "started_at", "ended_at"))
    return boxes, segments, sum(traffic.values(), Decimal(0))


def recent_step_s(run: Run, stats: list[PhaseStats]) -> float | None:
    """Mean step time over the newest steps (a checkpoint's slow step does not set the projection alone)."""
    trained = [p for p in stats if p.points]
    if not trained:
        return None
    last = trained[-1]
    since = max(last.first_step, last.last_step - 50)
    return MetricPoint.objects.filter(run=run, phase=last.index, step__gte=since).aggregate(s=Avg("step_s"))["s"]


def run_data(run: Run, now: datetime, stats: list[PhaseStats]) -> RunData:
    """The run's boxes, cost, projection and zero-gradient warnings: what the page's figures rest on."""
    boxes, segments, traffic = _boxes(run)
    cost = ledger.cost_in_window(segments, None, now) + traffic
    step_s = recent_step_s(run, stats)
    box = boxes.get(run.current_instance_id)
    rate = box.usd_per_hour if box else (list(boxes.values())[-1].usd_per_hour if boxes else None)
    planned = [p.planned_steps for p in stats]
    projection = project(planned=planned, current_phase=run.current_phase, current_step=run.current_step,
                         step_s=step_s, usd_per_hour=rate, cost_usd=cost, now=now, active=run.is_active,
                         finished_at=run.finished_at)
    offsets, total = {}, 0
    for p in stats:
        offsets[p.index] = total
        total += max(p.planned_steps, p.last_step or 0)
    return RunData(run, now, stats, boxes, cost, projection, zero_gradient_phases(stats), segments, traffic, offsets)


def list_projection(run: Run, cost_usd: Decimal, now: datetime) -> Projection:
    """The runs list's projection, from what the list already loaded: the run's phases (prefetched), its latest step
    time (latest_step_annotations) and its current box's price."""
    box = run.current_instance
    return project(planned=[p.steps for p in run.phases.all()], current_phase=run.current_phase,
                   current_step=run.current_step, step_s=getattr(run, "last_step_s", None),
                   usd_per_hour=box.usd_per_hour if box else None, cost_usd=cost_usd, now=now, active=run.is_active,
                   finished_at=run.finished_at)


def latest_step_annotations() -> dict:
    """The newest reported step time and tokens/s of each run, as subqueries over a Run queryset (the unique index on
    (run, phase, step) serves them backwards)."""
    newest = MetricPoint.objects.filter(run=OuterRef("pk")).order_by("-phase", "-step")
    return {"last_step_s": Subquery(newest.exclude(step_s=None).values("step_s")[:1]),
            "last_tokens_per_s": Subquery(newest.exclude(tokens_per_s=None).values("tokens_per_s")[:1])}


def bucket_rows(run: Run, width: int) -> list[dict]:
    """The run's points grouped by (phase, step // width, box), with each charted metric's minimum and maximum and
    what the phase figures need. Phases behind the one training now no longer change, so their buckets are cached
    (a restart, which may train the end of a phase again, starts a new cache entry); only the live phase is read."""
    settled_before = run.current_phase if run.is_active else None
    key = f"run-buckets:{run.pk}:{run.created_at.timestamp()}:{width}:{run.state}:{run.restarts}:{run.current_phase}"
    settled = cache.get(key)
    if settled is None:
        points = MetricPoint.objects.filter(run=run)
        settled = _aggregate(points if settled_before is None else points.filter(phase__lt=settled_before), width)
        cache.set(key, settled, timeout=SETTLED_CACHE_S)
    live = [] if settled_before is None else _aggregate(
        MetricPoint.objects.filter(run=run, phase__gte=settled_before), width)
    return settled + live


def _aggregate(points, width: int) -> list[dict]:
    aggregates = {"points": Count("id"), "x_first": Min("step"), "x_last": Max("step"), "step_s_avg": Avg("step_s"),
                  "grad_norm_routed_points": Count("grad_norm_routed"), "routed_b_zero_points": Count("routed_b_zero")}
    for name in ENVELOPED:
        aggregates[f"{name}_low"] = Min(name)
        aggregates[f"{name}_high"] = Max(name)
    # step / width is integer division on PostgreSQL and SQLite alike.
    bucket = ExpressionWrapper(F("step") / Value(width), output_field=IntegerField())
    query = points.annotate(bucket=bucket).values("phase", "bucket", "instance_id").order_by().annotate(**aggregates)
    if connection.vendor != "postgresql":
        return list(query)
    with transaction.atomic():
        # The planner cannot foresee how few buckets there are and would sort every point on disk; with the memory
        # for a hash aggregate it groups them in one pass.
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL work_mem = '32MB'")
        return list(query)


def _edge_points(run: Run, stats: list[PhaseStats]) -> dict[tuple[int, int], dict]:
    edges = Q(pk__in=[])
    for p in stats:
        if p.points:
            edges |= Q(phase=p.index, step__in=[p.first_step, p.last_step])
    rows = MetricPoint.objects.filter(run=run).filter(edges).values("phase", "step", "at", "instance_id", *ENVELOPED)
    return {(r["phase"], r["step"]): r for r in rows}


def _rounded(values: list, significant: int = 5) -> list:
    """Values to about `significant` digits of the series' largest magnitude: a smaller JSON, the same chart."""
    largest = max((abs(v) for v in values if v is not None), default=0)
    if not largest or not math.isfinite(largest):
        return values
    digits = significant - 1 - math.floor(math.log10(largest))
    return [None if v is None else round(v, digits) for v in values]


def run_charts(run: Run, now: datetime) -> dict:
    """Every chart of the run page as Plotly figures (data and layout), with the figures the page shows beside."""
    # The bucket width comes from the planned steps, known before the points are read.
    phases = list(run.phases.values_list("index", "name", "kind", "steps"))
    planned = sum(steps for *_, steps in phases) or run.current_step
    width = bucket_width(planned)
    rows = bucket_rows(run, width)
    stats = phase_stats(phases, rows)
    total_points = sum(p.points for p in stats)
    edges = _edge_points(run, stats) if total_points else {}
    # When each phase ran comes from its first and last point (timestamps cost more to read than numbers).
    stats = [replace(p, first_at=edges[(p.index, p.first_step)]["at"], last_at=edges[(p.index, p.last_step)]["at"])
             if p.points else p for p in stats]
    data = run_data(run, now, stats)
    off = data.offsets
    for r in rows:
        r["x_first"] += off.get(r["phase"], 0)
        r["x_last"] += off.get(r["phase"], 0)
    rows.sort(key=lambda r: r["x_first"])
    figures = [
        _timeline(data),
        _per_box(data, rows, edges, "step_s", "step-time", "Step time by box", "seconds per step"),
        _per_phase(data, rows, edges, "loss", "loss", "Loss per phase", "loss"),
        _grad_norms(data, rows, edges),
        _b_matrices(data, rows, edges),
        _per_box(data, rows, edges, "tokens_per_s", "tokens", "Tokens per second by box", "tokens/s"),
        _cost(data),
        _cost_per_step(data, rows),
    ]
    return {"figures": figures, "data": data, "points": total_points, "bucket_steps": width}


# --- figures ------------------------------------------------------------------------------------------------------

def _layout(title: str, y_title: str, **extra) -> dict:
    layout = {"title": {"text": title, "x": 0, "xanchor": "left", "font": {"size": 14}},
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
        m[2], m[3] = _min(m[2], low), _max(m[3], high)
    return [Bucket(*m) for m in merged.values()]


def _edge(data: RunData, edges: dict, p: PhaseStats, which: str, name: str, instance: int | None = None):
    step = p.first_step if which == "first" else p.last_step
    row = edges.get((p.index, step))
    if row is None or (instance is not None and row["instance_id"] != instance):
        return None
    return data.offsets[p.index] + step, row[name]


def _trace(name: str, xs: list, ys: list, colour: str, **extra) -> dict:
    return {"type": "scattergl" if len(xs) > 5000 else "scatter", "mode": "lines", "name": name, "x": xs,
            "y": _rounded(ys), "line": {"color": colour, "width": 1.6}, **extra}


def _phase_series(data: RunData, rows: list[dict], edges: dict, name: str, p: PhaseStats) -> tuple[list, list]:
    return envelope(_merged(rows, name, phase=p.index), _edge(data, edges, p, "first", name),
                    _edge(data, edges, p, "last", name))


def _per_phase(data: RunData, rows, edges, name, chart_id, title, y_title, **layout) -> dict:
    traces = []
    for p in data.stats:
        if p.points:
            xs, ys = _phase_series(data, rows, edges, name, p)
            traces.append(_trace(f"{p.index} · {p.name}", xs, ys, PHASE_COLOURS[p.index % len(PHASE_COLOURS)]))
    return {"id": chart_id, "title": title, "data": traces,
            "layout": _layout(title, y_title, shapes=_phase_marks(data), **layout)}


def _per_box(data: RunData, rows, edges, name, chart_id, title, y_title) -> dict:
    traces = []
    for i, (instance_id, box) in enumerate(data.boxes.items()):
        box_rows = [r for r in rows if r["instance_id"] == instance_id]
        if not box_rows:
            continue
        xs, ys = envelope(_merged(box_rows, name))
        traces.append(_trace(box.name, xs, ys, BOX_COLOURS[i % len(BOX_COLOURS)],
                             hovertemplate=f"%{{y:.4g}}<extra>{box.name} (host {box.machine_id or '?'})</extra>"))
    orphans = [r for r in rows if r["instance_id"] not in data.boxes]
    if orphans:
        xs, ys = envelope(_merged(orphans, name))
        traces.append(_trace("unknown box", xs, ys, "#5b6475"))
    return {"id": chart_id, "title": title, "data": traces,
            "layout": _layout(title, y_title, shapes=_phase_marks(data) + _host_changes(data, rows))}


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
            x0 = data.offsets[p.index] + p.first_step
            shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": x0,
                           "x1": data.offsets[p.index] + p.last_step, "y0": 0, "y1": 1,
                           "fillcolor": "rgba(180,35,24,0.10)", "line": {"width": 0},
                           "label": {"text": "routed gradient = 0", "textposition": "middle center",
                                     "font": {"color": "#b42318", "size": 12}}})
    title = "Gradient norms: routed experts (solid) vs attention (dotted)"
    return {"id": "grad-norms", "title": title, "data": traces,
            "layout": _layout(title, "LoRA gradient norm", shapes=shapes, yaxis={"type": "log"})}


def _b_matrices(data: RunData, rows, edges) -> dict:
    traces = []
    for p in data.stats:
        if not p.points:
            continue
        colour = PHASE_COLOURS[p.index % len(PHASE_COLOURS)]
        xs, ys = _phase_series(data, rows, edges, "routed_b_norm", p)
        traces.append(_trace(f"B norm · {p.name}", xs, ys, colour))
        xs, ys = _phase_series(data, rows, edges, "routed_b_zero", p)
        traces.append(_trace(f"B at zero · {p.name}", xs, ys, colour, yaxis="y2",
                             line={"color": colour, "width": 1.2, "dash": "dash", "shape": "hv"}))
    title = "Routed LoRA B: norm (solid) and matrices still at zero (dashed)"
    return {"id": "b-matrices", "title": title, "data": traces,
            "layout": _layout(title, "B norm", shapes=_phase_marks(data),
                              yaxis2={"title": {"text": "B matrices at zero"}, "overlaying": "y", "side": "right",
                                      "rangemode": "tozero", "showgrid": False},
                              margin={"l": 64, "r": 56})}


def _cost(data: RunData) -> dict:
    times, values = cost_curve(data.segments, data.traffic_usd, data.now)
    traces = [{"type": "scatter", "mode": "lines", "name": "cost so far", "x": [t.isoformat() for t in times],
               "y": [round(v, 4) for v in values], "line": {"color": "#2457c5", "width": 2},
               "fill": "tozeroy", "fillcolor": "rgba(36,87,197,0.08)"}]
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
            "layout": _layout(title, "USD", xaxis={"type": "date"}, legend={"y": -0.2},
                              yaxis={"tickprefix": "$", "rangemode": "tozero"})}


def _cost_per_step(data: RunData, rows: list[dict]) -> dict:
    """Dollars per step on each box: its hourly price times its mean step time in the bucket."""
    traces = []
    for i, (instance_id, box) in enumerate(data.boxes.items()):
        rate = float(box.usd_per_hour) / 3600
        points = [(r["x_last"], r["step_s_avg"] * rate) for r in rows
                  if r["instance_id"] == instance_id and r["step_s_avg"] is not None]
        if points:
            xs, ys = zip(*points)
            traces.append(_trace(f"$/step · {box.name}", list(xs), list(ys), BOX_COLOURS[i % len(BOX_COLOURS)]))
    title = "Cost per step"
    return {"id": "cost-per-step", "title": title, "data": traces,
            "layout": _layout(title, "USD per step", shapes=_phase_marks(data) + _host_changes(data, rows),
                              yaxis={"tickprefix": "$", "rangemode": "tozero"})}


def _timeline(data: RunData) -> dict:
    """Phases and boxes as bars over time, with the moments a host was lost or hung."""
    traces = []
    for p in data.stats:
        if p.first_at is None:
            continue
        colour = PHASE_COLOURS[p.index % len(PHASE_COLOURS)]
        traces.append({"type": "scatter", "mode": "lines", "name": f"phase {p.index} · {p.name}",
                       "x": [p.first_at.isoformat(), p.last_at.isoformat()], "y": ["phases", "phases"],
                       "line": {"color": colour, "width": 18},
                       "hovertemplate": f"{p.name} ({p.kind}): steps {p.first_step}–{p.last_step}<extra></extra>"})
    for i, box in enumerate(data.boxes.values()):
        if box.started_at is None:
            continue
        end = box.ended_at or data.now
        traces.append({"type": "scatter", "mode": "lines", "name": f"box · {box.name}",
                       "x": [box.started_at.isoformat(), end.isoformat()], "y": ["boxes", "boxes"],
                       "line": {"color": BOX_COLOURS[i % len(BOX_COLOURS)], "width": 18},
                       "hovertemplate": f"{box.name}, host {box.machine_id or '?'}: "
                                        f"{box.end_reason or 'running'}<extra></extra>"})
    restarts = list(RunEvent.objects.filter(run=data.run, kind__in=RESTART_EVENTS).order_by("at")
                    .values_list("at", "kind", "message")[:200])
    if restarts:
        traces.append({"type": "scatter", "mode": "markers", "name": "host lost / hung",
                       "x": [at.isoformat() for at, _, _ in restarts], "y": ["boxes"] * len(restarts),
                       "text": [f"{kind}: {message}" for _, kind, message in restarts],
                       "hovertemplate": "%{text}<extra></extra>",
                       "marker": {"symbol": "x", "size": 13, "color": "#b42318", "line": {"width": 2}}})
    title = "Timeline: phases, boxes and restarts"
    return {"id": "timeline", "title": title, "data": traces,
            "layout": _layout(title, "", height=190, hovermode="closest", showlegend=False,
                              xaxis={"title": {"text": "time (UTC)"}, "type": "date"},
                              yaxis={"title": {"text": ""}, "categoryorder": "array",
                                     "categoryarray": ["boxes", "phases"]})}
