"""The run page's chart data, the full data as CSV, and the comparison page across runs and GPU models. Views read
only: the data comes from runs/run_data.py, every figure from runs/figures.py, encoded by plotly's JSON encoder."""

import csv
from collections import defaultdict
from decimal import Decimal

from django.db.models import Count
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.text import slugify
from django.views.decorators.http import require_GET

from fleet.instances import ledger
from fleet.offers.calibration import load_calibration
from fleet.models import Instance
from fleet.ranking.throughput import gpu_model_key
from plotly.io.json import to_json_plotly

from runs import evaluations, figures, router_figures, run_data, sharing
from runs import phase_figures
from runs.projection import STEPS_PER_PRICE
from runs.models import MetricPoint, Run

LIVE_REFRESH_S = 10
WARMUP_STEPS = 3  # the first steps of a box compile kernels and fill caches; comparisons leave them out


@require_GET
def run_chart_data(request, pk):
    run = sharing.run_or_404(request.user, pk, Run.objects.select_related("current_instance"))
    inputs = run_data.chart_inputs(run, timezone.now())
    data = inputs.data
    summary = render_to_string("runs/_run_summary.html", {"run": run, "data": data, "now": data.now},
                               request=request)
    return HttpResponse(to_json_plotly({
        "run": run.pk, "state": run.state, "active": run.is_active, "refresh_s": LIVE_REFRESH_S,
        "points": inputs.points, "bucket_steps": inputs.bucket_steps, "warnings": data.warnings,
        "summary_html": summary, "figures": figures.run_figures(inputs) + router_figures.router_figures(data)
        + phase_figures.phase_kind_figures(inputs)}),
        content_type="application/json")


class _Echo:
    def write(self, value):
        return value


# A spreadsheet evaluates a text cell that starts like a formula (=HYPERLINK(...), +cmd|...): text a box or a
# marketplace chose (a GPU name, a label, a kernel path) gets a leading quote; numbers, negative ones too, stay numbers.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value):
    if isinstance(value, str):
        return "'" + value if value.startswith(_FORMULA_STARTS) else value
    return value.isoformat() if hasattr(value, "isoformat") else value


@require_GET
def run_metrics_csv(request, pk):
    """Every step the run's boxes reported, streamed so a long run never sits in memory."""
    run = sharing.run_or_404(request.user, pk)
    rows = MetricPoint.objects.filter(run=run).order_by("phase", "step").values_list(*run_data.CSV_COLUMNS)
    writer = csv.writer(_Echo())
    header = [c.replace("instance__label", "box").replace("instance__gpu_name", "gpu") for c in run_data.CSV_COLUMNS]

    def lines():
        yield writer.writerow(header)
        for row in rows.iterator(chunk_size=5000):
            yield writer.writerow([_csv_cell(v) for v in row])

    name = slugify(run.name) or "run"
    return StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8", headers={
        "Content-Disposition": f'attachment; filename="run-{run.pk}-{name}-metrics.csv"'})


def comparison_rows(user) -> list[dict]:
    """Steady-state step time, tokens/s and $ per 1k steps of every box each run `user` sees trained on, from one
    GROUP BY."""
    steady = (MetricPoint.objects.filter(step__gte=WARMUP_STEPS, instance__isnull=False,
                                         run__in=sharing.runs_for(user))
              .exclude(step_s=None).values("run_id", "instance_id", "kernel_path").order_by()
              .annotate(step_s=run_data.summable_avg("step_s"), tokens_per_s=run_data.summable_avg("tokens_per_s"),
                        steps=Count("id")))
    rows = list(steady)
    runs = dict(Run.objects.filter(pk__in={r["run_id"] for r in rows}).values_list("pk", "name"))
    boxes = {b["pk"]: b for b in Instance.objects.filter(pk__in={r["instance_id"] for r in rows})
             .values("pk", "label", "gpu_name", "num_gpus", "usd_per_hour")}
    for r in rows:
        box = boxes[r["instance_id"]]
        r.update(run_name=runs.get(r["run_id"], "?"), box=box["label"], gpu_model=gpu_model_key(box["gpu_name"]),
                 num_gpus=box["num_gpus"], usd_per_hour=box["usd_per_hour"],
                 usd_per_1k_steps=box["usd_per_hour"] * Decimal(str(r["step_s"])) * STEPS_PER_PRICE
                 / ledger.SECONDS_PER_HOUR)
    rows.sort(key=lambda r: (r["gpu_model"], r["kernel_path"], r["step_s"]))
    return rows


def by_gpu_model(rows: list[dict]) -> list[dict]:
    """The comparison per GPU model and kernel path, each box weighted by the steps it trained."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["gpu_model"], r["num_gpus"], r["kernel_path"] or "?")].append(r)
    summary = []
    for (gpu, num_gpus, path), members in sorted(groups.items()):
        steps = sum(m["steps"] for m in members)
        tokens = [m for m in members if m["tokens_per_s"] is not None]
        summary.append({
            "gpu_model": gpu, "num_gpus": num_gpus, "kernel_path": path, "runs": len({m["run_id"] for m in members}),
            "steps": steps, "step_s": sum(m["step_s"] * m["steps"] for m in members) / steps,
            "tokens_per_s": (sum(m["tokens_per_s"] * m["steps"] for m in tokens) / sum(m["steps"] for m in tokens)
                             if tokens else None),
            "usd_per_1k_steps": sum(m["usd_per_1k_steps"] * m["steps"] for m in members) / steps,
        })
    return summary


def _bar_figure(chart_id: str, title: str, y_title: str, groups: list[dict], field: str, money: bool = False):
    """Bars per GPU model, one trace per kernel path."""
    paths = sorted({g["kernel_path"] for g in groups})
    traces = []
    for i, path in enumerate(paths):
        mine = [g for g in groups if g["kernel_path"] == path and g[field] is not None]
        # The kernel path is what a box reported and the GPU model what a marketplace named: plain text.
        traces.append({"type": "bar", "name": figures.plain(f"{path} kernels"),
                       "x": [figures.plain(f"{g['num_gpus']}× {g['gpu_model']}") for g in mine],
                       "y": [round(float(g[field]), 6) for g in mine],
                       "marker": {"color": figures.BOX_COLOURS[i % len(figures.BOX_COLOURS)]}})
    # GPU names are long ("1× RTX PRO 6000 Blackwell Server Edition"): tilted, with room made for them below.
    layout = figures.layout(title, y_title, barmode="group", hovermode="closest",
                            xaxis={"title": {"text": ""}, "automargin": True, "tickangle": -30},
                            yaxis=figures.MONEY_AXIS if money else {})
    return {"id": chart_id, "title": title, "data": traces, "layout": layout}


def compare(request):
    rows = comparison_rows(request.user)
    groups = by_gpu_model(rows)
    figures = [
        _bar_figure("compare-step-time", "Step time by GPU model", "seconds per step", groups, "step_s"),
        _bar_figure("compare-tokens", "Tokens per second by GPU model", "tokens/s", groups, "tokens_per_s"),
        _bar_figure("compare-usd-per-step", "Cost per 1k steps by GPU model", "USD per 1,000 steps", groups,
                    "usd_per_1k_steps", money=True),
    ]
    calibration = sorted(load_calibration().entries.values(), key=lambda e: (e.gpu_model, e.kernel_path))
    evaluated = evaluations.ranked_runs(sharing.runs_for(request.user))  # promoted runs first
    return render(request, "runs/compare.html", {"rows": rows, "groups": groups, "figures": figures,
                                                 "evaluated": evaluated,
                                                 "calibration": calibration, "warmup_steps": WARMUP_STEPS})
