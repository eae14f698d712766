"""What a run's page and charts rest on, read from the database with a fixed number of lean queries: its points
bucketed in SQL, its boxes and their cost, its projection, its restarts."""

import sys
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal

from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import Avg, Count, ExpressionWrapper, F, IntegerField, Max, Min, OuterRef, Q, Subquery, Value

from fleet.models import CostSegment
from runs.costs import run_costs
from runs.downsample import bucket_width
from runs.models import MetricPoint, Run, RunAttempt, RunEvent
from runs.phase_stats import PhaseStats, phase_stats, zero_gradient_phases
from runs.router_loads import idle_warning, latest_per_phase
from runs.projection import Projection, StepTime, project, step_time
from training import metric_fields

SETTLED_CACHE_S = 600  # buckets of phases a run has left behind, kept this long


ENVELOPED = metric_fields.ENVELOPED


CSV_COLUMNS = (metric_fields.PHASE, metric_fields.STEP, metric_fields.AT, *metric_fields.NAMES, "instance__label",
               "instance__gpu_name")


RESTART_EVENTS = ("host_lost", "hung", "probe_failed")
RECENT_STEPS = 50  # the step time a projection rests on is the median of this many newest steps


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
    router_loads: dict[int, tuple[int, list]] = field(default_factory=dict)  # phase: (step, counts) of its newest
    idle_experts: list[str] = field(default_factory=list)  # the experts each phase's newest interval left idle


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


# No sum of this many values can overflow float8: every point a run can hold (100 phases of 10 million steps).
SUMMABLE = sys.float_info.max / ((metric_fields.KEY_LIMITS[metric_fields.PHASE] + 1)
                                 * (metric_fields.KEY_LIMITS[metric_fields.STEP] + 1))


def summable_avg(name: str) -> Avg:
    """The mean of a metric over the points whose value a sum can hold: NaN, the infinities and values that would
    overflow PostgreSQL's float8 sum are left out (docs/runs.md, "runs/run_data.py")."""
    return Avg(name, filter=Q(**{f"{name}__gte": -SUMMABLE, f"{name}__lte": SUMMABLE}))


def recent_step_times(runs: list[Run]) -> dict[int, StepTime | None]:
    """Each run's step time as every page shows it: the median and quartiles of the newest RECENT_STEPS steps of the
    newest phase it trained (projection.step_time: a checkpoint's slow step does not move it), for many runs with two
    queries."""
    newest = MetricPoint.objects.filter(run=OuterRef("pk")).order_by("-phase", "-step")
    ends = (Run.objects.filter(pk__in=[run.pk for run in runs])
            .annotate(last_phase=Subquery(newest.values("phase")[:1]), last_step=Subquery(newest.values("step")[:1]))
            .values_list("pk", "last_phase", "last_step"))
    recent = Q(pk__in=[])
    for pk, phase, step in ends:
        if phase is not None:
            recent |= Q(run_id=pk, phase=phase, step__gte=step - RECENT_STEPS)
    samples: dict[int, list[float]] = {}
    for run_id, seconds in MetricPoint.objects.filter(recent).exclude(step_s=None).values_list("run_id", "step_s"):
        samples.setdefault(run_id, []).append(seconds)
    return {run_id: step_time(times) for run_id, times in samples.items()}


def hourly_rates(runs: list[Run]) -> dict[int, Decimal]:
    """What each run pays per hour now: its current box's price, else (between boxes) the last box's."""
    rates = {}
    for run_id, rate in (RunAttempt.objects.filter(run__in=[run.pk for run in runs]).order_by("started_at", "id")
                         .values_list("run_id", "instance__usd_per_hour")):
        rates[run_id] = rate
    for run in runs:
        if run.current_instance is not None:
            rates[run.pk] = run.current_instance.usd_per_hour
    return rates


def projections(runs: list[Run], now: datetime) -> dict[int, Projection]:
    """The one projection every page shows (the runs list, the run page and its chart data): the cost so far, the
    planned steps of the run's phases, its recent step time and its hourly price."""
    costs, step_times, rates = run_costs(runs, now), recent_step_times(runs), hourly_rates(runs)
    return {run.pk: project(planned=[p.steps for p in run.phases.all()], current_phase=run.current_phase,
                            current_step=run.current_step, step_s=step_times.get(run.pk),
                            usd_per_hour=rates.get(run.pk), cost_usd=costs[run.pk], now=now, active=run.is_active,
                            finished_at=run.finished_at)
            for run in runs}


def run_data(run: Run, now: datetime, stats: list[PhaseStats]) -> RunData:
    """The run's boxes, cost, projection and zero-gradient warnings: what the page's figures rest on."""
    boxes, segments, traffic = _boxes(run)
    projection = projections([run], now)[run.pk]
    offsets, total = {}, 0
    for p in stats:
        offsets[p.index] = total
        total += max(p.planned_steps, p.last_step or 0)
    loads = {phase: (load.step, load.counts) for phase, load in latest_per_phase(run).items()}
    names = {p.index: p.name for p in stats}
    idle = [idle_warning(phase, names.get(phase, "?"), *loads[phase]) for phase in sorted(loads)]
    return RunData(run, now, stats, boxes, projection.cost_usd, projection, zero_gradient_phases(stats), segments,
                   traffic, offsets, loads, [w for w in idle if w])


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
    aggregates = {"points": Count("id"), "x_first": Min("step"), "x_last": Max("step"),
                  "step_s_avg": summable_avg("step_s"),
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


@dataclass
class ChartInputs:
    """Everything the run page's figures draw, read in one go: the run's data, its bucket rows (x along all
    phases), the exact first and last point of each phase, and its restarts."""

    data: RunData
    rows: list[dict]
    edges: dict[tuple[int, int], dict]
    points: int
    bucket_steps: int
    restarts: list[tuple] = field(default_factory=list)  # (at, kind, message) of hosts lost or hung


def _timed(p: PhaseStats, edges: dict) -> PhaseStats:
    first, last = p.step_span
    return replace(p, first_at=edges[(p.index, first)]["at"], last_at=edges[(p.index, last)]["at"])


def chart_inputs(run: Run, now: datetime) -> ChartInputs:
    # The bucket width comes from the planned steps, known before the points are read.
    phases = list(run.phases.values_list("index", "name", "kind", "steps"))
    planned = sum(steps for *_, steps in phases) or run.current_step
    width = bucket_width(planned)
    rows = bucket_rows(run, width)
    stats = phase_stats(phases, rows)
    total_points = sum(p.points for p in stats)
    edges = _edge_points(run, stats) if total_points else {}
    # When each phase ran comes from its first and last point (timestamps cost more to read than numbers).
    stats = [_timed(p, edges) if p.points else p for p in stats]
    data = run_data(run, now, stats)
    for r in rows:
        r["x_first"] += data.offsets.get(r["phase"], 0)
        r["x_last"] += data.offsets.get(r["phase"], 0)
    rows.sort(key=lambda r: r["x_first"])
    restarts = list(RunEvent.objects.filter(run=run, kind__in=RESTART_EVENTS).order_by("at")
                    .values_list("at", "kind", "message")[:200])
    return ChartInputs(data, rows, edges, total_points, width, restarts)
