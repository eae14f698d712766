import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import plotly.graph_objects as go
import pytest

from runs import downsample, figures, phase_stats, projection, run_data
from runs.downsample import Bucket
from runs.phase_stats import PhaseStats

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def buckets_of(xs, ys, width):
    """The reference bucketing the SQL does: (x // width) groups with their first/last x and min/max y."""
    groups = {}
    for x, y in zip(xs, ys, strict=True):
        groups.setdefault(x // width, []).append((x, y))
    return [Bucket(g[0][0], g[-1][0], min(y for _, y in g), max(y for _, y in g)) for _, g in sorted(groups.items())]


def test_it_keeps_every_buckets_minimum_and_maximum_within_the_size_bound():
    rng = random.Random(7)
    xs = list(range(1, 100_001))
    ys = [rng.gauss(1.0, 0.1) for _ in xs]
    ys[31_337], ys[77_777] = 9.0, -5.0  # a spike and a dip must survive
    width = downsample.bucket_width(len(xs))
    buckets = buckets_of(xs, ys, width)
    out_x, out_y = downsample.envelope(buckets, first=(xs[0], ys[0]), last=(xs[-1], ys[-1]))
    assert len(out_x) == len(out_y) <= 2 * downsample.MAX_BUCKETS + 2
    assert 9.0 in out_y and -5.0 in out_y
    kept = set(out_y)
    assert all(b.low in kept and b.high in kept for b in buckets[1:-1])
    assert out_x == sorted(out_x)


def test_it_keeps_the_first_and_last_point_exactly():
    xs, ys = list(range(10, 5010)), [float(i % 17) for i in range(5000)]
    out_x, out_y = downsample.envelope(buckets_of(xs, ys, 50), first=(10, 3.25), last=(5009, 7.5))
    assert (out_x[0], out_y[0]) == (10, 3.25)
    assert (out_x[-1], out_y[-1]) == (5009, 7.5)


def test_it_draws_a_smooth_series_along_its_trend():
    xs = list(range(1000))
    ys = [100.0 - x * 0.1 for x in xs]  # falling: every bucket gives its high first, then its low
    out_x, out_y = downsample.envelope(buckets_of(xs, ys, 10))
    assert out_y == sorted(out_y, reverse=True)


def test_it_keeps_short_series_whole():
    xs, ys = [1, 2, 3], [0.5, 0.4, 0.45]
    assert downsample.envelope(buckets_of(xs, ys, 1)) == (xs, ys)
    assert downsample.envelope([]) == ([], [])


def test_it_skips_buckets_without_values():
    out = downsample.envelope([Bucket(1, 5, None, None), Bucket(6, 10, 2.0, 2.0)])
    assert out == ([8.0], [2.0])  # a flat bucket is one point at its middle


@pytest.mark.parametrize("points, width", [(0, 1), (1, 1), (1000, 1), (1001, 2), (100_000, 100), (250_000, 250)])
def test_it_sizes_buckets_to_the_bound(points, width):
    assert downsample.bucket_width(points) == width


def phase(index, name="sft", **figures):
    return PhaseStats(index=index, name=name, kind=name, planned_steps=100, points=100, first_step=1, last_step=100,
                      **figures)


def test_it_names_the_phase_whose_routed_gradient_is_zero():
    stats = [phase(0, "cpt", routed_grad_points=100, max_grad_routed=0.31),
             phase(1, "sft", routed_grad_points=100, max_grad_routed=0.0)]
    warnings = phase_stats.zero_gradient_phases(stats)
    assert len(warnings) == 1 and warnings[0].startswith("Phase 1 (sft)") and "100 steps" in warnings[0]


def test_it_names_the_phase_whose_routed_b_matrices_never_leave_zero():
    stats = [phase(0, "cpt", b_zero_points=100, min_b_zero=0, max_b_zero=96),  # B moved off zero: training
             phase(2, "dpo", b_zero_points=50, min_b_zero=96, max_b_zero=96)]
    warnings = phase_stats.zero_gradient_phases(stats)
    assert len(warnings) == 1 and warnings[0].startswith("Phase 2 (dpo)") and "96 routed LoRA B" in warnings[0]


def test_it_does_not_warn_for_a_healthy_or_unstarted_run():
    assert phase_stats.zero_gradient_phases([phase(0, routed_grad_points=100, max_grad_routed=0.2, b_zero_points=100,
                                              min_b_zero=0, max_b_zero=0)]) == []
    assert phase_stats.zero_gradient_phases([PhaseStats(0, "cpt", "cpt", 100)]) == []
    # One step with B still at zero is how every phase starts, not a warning.
    assert phase_stats.zero_gradient_phases([phase(0, b_zero_points=1, min_b_zero=96, max_b_zero=96)]) == []


def test_it_projects_finish_and_total_cost_at_the_recent_step_time():
    p = projection.project(planned=[100, 100, 50], current_phase=1, current_step=50, step_s=36.0,
                       usd_per_hour=Decimal("1.20"), cost_usd=Decimal("3.00"), now=T0, active=True)
    assert p.steps_done == 150 and p.steps_total == 250 and p.percent == 60.0
    assert p.finish_at == T0 + timedelta(seconds=100 * 36)
    assert p.total_usd == Decimal("3.00") + Decimal("1.20")  # an hour more at $1.20/h
    assert p.usd_per_step == Decimal("0.012")


def test_it_projects_nothing_before_the_first_step():
    p = projection.project(planned=[100], current_phase=0, current_step=0, step_s=None, usd_per_hour=Decimal("1"),
                       cost_usd=Decimal("0.10"), now=T0, active=True)
    assert p.finish_at is None and p.total_usd is None and p.usd_per_step is None


def test_it_reports_an_ended_run_as_it_happened():
    p = projection.project(planned=[10, 10], current_phase=1, current_step=10, step_s=30.0, usd_per_hour=None,
                       cost_usd=Decimal("4.20"), now=T0, active=False, finished_at=T0 - timedelta(hours=1))
    assert p.total_usd == Decimal("4.20") and p.finish_at == T0 - timedelta(hours=1) and p.percent == 100.0


def test_it_draws_the_cost_curve_exactly_from_cost_segments():
    segments = [(Decimal("1.20"), T0, T0 + timedelta(hours=1)), (Decimal("2.40"), T0 + timedelta(hours=1.5), None)]
    times, values = projection.cost_curve(segments, Decimal("0.50"), T0 + timedelta(hours=2))
    assert times == [T0, T0 + timedelta(hours=1), T0 + timedelta(hours=1.5), T0 + timedelta(hours=2)]
    assert values == [0.5, 1.7, 1.7, 2.9]
    assert projection.cost_curve([], Decimal(0), T0) == ([], [])


def test_it_folds_phase_figures_from_bucket_rows():
    def row(phase, first, last, points, grad_high, b_low, b_high):
        return {"phase": phase, "x_first": first, "x_last": last, "points": points,
                "grad_norm_routed_points": points, "grad_norm_routed_high": grad_high,
                "routed_b_zero_points": points, "routed_b_zero_low": b_low, "routed_b_zero_high": b_high}

    rows = [row(0, 1, 9, 9, 0.4, 0, 96), row(0, 10, 19, 10, 0.5, 0, 0), row(1, 1, 9, 9, 0.0, 96, 96),
            row(1, 10, 12, 3, 0.0, 96, 96), row(3, 1, 2, 2, 1.0, 0, 0)]
    stats = phase_stats.phase_stats([(0, "cpt", "cpt", 19), (1, "sft", "sft", 12), (2, "dpo", "dpo", 5)], rows)
    assert [(s.index, s.points, s.first_step, s.last_step) for s in stats] == [
        (0, 19, 1, 19), (1, 12, 1, 12), (2, 0, None, None), (3, 2, 1, 2)]
    assert stats[0].max_grad_routed == 0.5 and stats[0].min_b_zero == 0 and stats[0].max_b_zero == 96
    assert stats[3].name == "phase 3"  # points of a phase the run does not list still show
    assert [w[:13] for w in phase_stats.zero_gradient_phases(stats)] == ["Phase 1 (sft)"]


@pytest.mark.django_db
def test_it_downsamples_a_long_run_in_the_database():
    from django.core.cache import cache

    from runs.models import MetricPoint
    from tests.runs.seeding import seed_run

    cache.clear()
    run = seed_run(phases=(("cpt", "cpt", 3000), ("sft", "sft", 3000)), zero_routed_phase=None)
    MetricPoint.objects.filter(run=run, phase=1, step=1234).update(step_s=999.0)
    width = downsample.bucket_width(6000, max_buckets=100)
    rows = run_data.bucket_rows(run, width)
    assert len(rows) <= 100 + 2 * 2  # a bucket split by the phase boundary or the host change counts twice
    assert sum(r["points"] for r in rows) == 6000
    assert max(r["step_s_high"] for r in rows) == 999.0
    drawn = figures.run_figures(run_data.chart_inputs(run, run.finished_at))
    for figure in drawn:
        plotly_figure(figure)
        for trace in figure["data"]:
            assert len(trace["x"]) <= 2 * downsample.MAX_BUCKETS + 2
    step_time = next(f for f in drawn if f["id"] == "step-time")
    assert 999.0 in step_time["data"][1]["y"]


@pytest.mark.django_db
def test_it_reads_only_the_live_phase_again_while_a_run_trains():
    from django.core.cache import cache
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runs.models import MetricPoint, Run
    from tests.runs.seeding import seed_run

    cache.clear()
    run = seed_run(state="training")
    Run.objects.filter(pk=run.pk).update(current_phase=1, current_step=40)
    run.refresh_from_db()
    first = run_data.bucket_rows(run, 1)
    MetricPoint.objects.filter(run=run, phase=0, step=5).update(loss=123.0)  # behind the live phase: not re-read
    MetricPoint.objects.filter(run=run, phase=1, step=5).update(loss=456.0)
    with CaptureQueriesContext(connection) as queries:
        again = run_data.bucket_rows(run, 1)
    sql = " ".join(q["sql"] for q in queries.captured_queries)
    assert '"phase" >= 1' in sql and '"phase" < 1' not in sql
    losses = {r["loss_high"] for r in again}
    assert 456.0 in losses and 123.0 not in losses and len(again) == len(first)
    Run.objects.filter(pk=run.pk).update(restarts=1)  # a restart may train the phase's end again: read it all
    run.refresh_from_db()
    assert 123.0 in {r["loss_high"] for r in run_data.bucket_rows(run, 1)}


def plotly_figure(figure: dict):
    """The figure as plotly's own schema reads it: a misspelt attribute or a bad value raises here."""
    return go.Figure({"data": figure["data"], "layout": figure["layout"]})
