"""A run page with 100,000 metric points in PostgreSQL: p50 and p95 of the page and of its chart data endpoint.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fleet python bench/run_page.py [--points 100000] [--smoke]

Creates a throwaway database (bench/support.py), bulk-inserts a five-phase run on three boxes (two host changes),
logs in a user with django.test.Client and times the page, the chart data (JSON, downsampled in SQL; steady state,
as a page that polls it sees it, and cold, with the cached buckets of settled phases dropped before each request)
and the runs list.
The last line is JSON. Goal: p95 <= 150 ms for the page and the chart data. --smoke: 2,000 points, 5 requests each.
"""

import argparse
import json
import math
import statistics
import time
from datetime import timedelta
from decimal import Decimal

import support

support.setup_django("run-page")

from django.conf import settings  # noqa: E402
from django.core.cache import cache  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import reverse  # noqa: E402
from django.utils import timezone  # noqa: E402

from fleet.models import CostSegment, Instance  # noqa: E402
from runs.models import MetricPoint, Phase, Run, RunAttempt, RunEvent  # noqa: E402

PHASES = (("cpt", "cpt"), ("sft", "sft"), ("dpo", "dpo"), ("kto", "kto"), ("grpo", "grpo"))
BOXES = (("H200", Decimal("1.20"), 28.5), ("RTX PRO 6000", Decimal("1.05"), 57.0), ("H200 NVL", Decimal("1.35"), 27.0))
REPEAT, WARMUP = 40, 5
SMOKE_POINTS, SMOKE_REPEAT, SMOKE_WARMUP = 2_000, 5, 1


def fill(points: int, owner) -> Run:
    now = timezone.now()
    per_phase = points // len(PHASES)
    start = now - timedelta(hours=36)
    run = Run.objects.create(name="bench-35b-a3b", recipe={}, bucket="s3://bench/runs", budget_usd=Decimal("5000"),
                             token_nonce="bench", state="training", created_at=start, started_at=start,
                             current_phase=len(PHASES) - 1, current_step=per_phase - 10, created_by=owner)
    Phase.objects.bulk_create([Phase(run=run, index=i, name=name, kind=kind, steps=per_phase)
                               for i, (name, kind) in enumerate(PHASES)])
    boxes = [Instance.objects.create(provider="vast", idempotency_key=f"bench-{i}", label=f"bench-box-{i}",
                                     state="running" if i == len(BOXES) - 1 else "destroyed", purpose="training",
                                     offer_id=str(i), gpu_name=gpu, machine_id=f"m{i}", image="img", disk_gb=250,
                                     requested_at=start, usd_per_hour=rate)
             for i, (gpu, rate, _) in enumerate(BOXES)]
    total = per_phase * len(PHASES)
    seconds_per_step = (36 * 3600) / total
    switches = (total // 3, 2 * total // 3)
    rows, g = [], 0
    for p in range(len(PHASES)):
        for step in range(1, per_phase + 1):
            box = sum(g >= s for s in switches)
            at = start + timedelta(seconds=g * seconds_per_step)
            noise = math.sin(g * 12.9898) * 0.05
            rows.append(MetricPoint(
                run=run, phase=p, step=step, at=at, loss=2.0 * math.exp(-step / 4000) + 0.5 + noise, lr=1e-4,
                step_s=BOXES[box][2] * (1 + noise), tokens_per_s=65536 / (BOXES[box][2] * (1 + noise)),
                grad_norm_routed=0.0 if p == 2 else 0.3 + noise, grad_norm_attention=1.1 + noise, grad_norm_total=1.4,
                routed_b_norm=0.001 * g ** 0.5, routed_b_zero=0 if g else 96, gpu_mem_gib=71.5, kernel_path="triton",
                instance=boxes[box]))
            g += 1
    MetricPoint.objects.bulk_create(rows, batch_size=5000)
    edges = [start, *(start + timedelta(seconds=s * seconds_per_step) for s in switches), None]
    for i, box in enumerate(boxes):
        RunAttempt.objects.create(run=run, instance=box, started_at=edges[i], ended_at=edges[i + 1],
                                  end_reason="" if edges[i + 1] is None else "No heartbeat for 75 s.")
        CostSegment.objects.create(instance=box, usd_per_hour=box.usd_per_hour, started_at=edges[i],
                                   ended_at=edges[i + 1])
        if edges[i + 1] is not None:
            RunEvent.objects.create(run=run, at=edges[i + 1], kind="host_lost", message="No heartbeat for 75 s.")
    Run.objects.filter(pk=run.pk).update(current_instance=boxes[-1])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_metricpoint")
    return run


def timed(client: Client, url: str, *, cold: bool = False, repeat: int = REPEAT, warmup: int = WARMUP) -> dict:
    """p50/p95 of `url`; cold: with the cache of settled phases emptied before every request."""
    for _ in range(warmup):
        assert client.get(url).status_code == 200, url
    times, size = [], 0
    for _ in range(repeat):
        if cold:
            cache.clear()
        start = time.perf_counter()
        response = client.get(url)
        size = len(response.content)
        times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, url
    times.sort()
    return {"p50": round(statistics.median(times), 1), "p95": round(times[math.ceil(0.95 * len(times)) - 1], 1),
            "bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--smoke", action="store_true",
                        help=f"{SMOKE_POINTS:,} points, {SMOKE_REPEAT} timed requests of each URL")
    args = parser.parse_args()
    sizes = dict(repeat=SMOKE_REPEAT, warmup=SMOKE_WARMUP) if args.smoke else {}
    settings.STORAGES = {**settings.STORAGES,  # render pages without collectstatic's manifest
                         "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
    with support.throwaway_database("bench_run_page"):
        fill_start = time.perf_counter()
        owner = User.objects.create_user("bench", password="bench-pass-123")  # the run's owner reads its page
        run = fill(SMOKE_POINTS if args.smoke else args.points, owner)
        fill_s = time.perf_counter() - fill_start
        client = Client()
        client.force_login(owner)
        page = timed(client, reverse("run_detail", args=[run.pk]), **sizes)
        data = timed(client, reverse("run_chart_data", args=[run.pk]), **sizes)
        cold = timed(client, reverse("run_chart_data", args=[run.pk]), cold=True, **sizes)
        listing = timed(client, reverse("runs"), **sizes)
        payload = client.get(reverse("run_chart_data", args=[run.pk])).json()
        largest = max(len(t.get("x", [])) for f in payload["figures"] for t in f["data"])
        points = MetricPoint.objects.filter(run=run).count()
    print(f"{points} points inserted in {fill_s:.1f} s")
    print(f"run page:   p50 {page['p50']} ms, p95 {page['p95']} ms ({page['bytes']} bytes)")
    print(f"chart data: p50 {data['p50']} ms, p95 {data['p95']} ms ({data['bytes']} bytes, "
          f"largest trace {largest} points)")
    print(f"chart data, every phase read again (cold cache): p50 {cold['p50']} ms, p95 {cold['p95']} ms")
    print(f"runs list:  p50 {listing['p50']} ms, p95 {listing['p95']} ms")
    print(json.dumps({"points": points, "page_p50_ms": page["p50"], "page_p95_ms": page["p95"],
                      "data_p50_ms": data["p50"], "data_p95_ms": data["p95"], "data_bytes": data["bytes"],
                      "data_cold_p50_ms": cold["p50"], "data_cold_p95_ms": cold["p95"],
                      "largest_trace_points": largest, "list_p95_ms": listing["p95"], "goal_p95_ms": 150,
                      "met": max(page["p95"], data["p95"]) <= 150}))


if __name__ == "__main__":
    main()
