"""Metric points per second through the agent API into PostgreSQL, with batched posts as the on-box agent sends them.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fleet python bench/ingest.py [--smoke]

Makes a throwaway database, serves the product with gunicorn (2 workers, as on this 2-core machine), and posts
100,000 points in batches of 500 from 4 concurrent clients, each a run's box (its current attempt on a running
instance) with that attempt's token. The last line is JSON; the goal is >= 2,000 points/s. --smoke: 4,000 points.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from decimal import Decimal

import support

support.setup_django("ingest")

import httpx  # noqa: E402
from django.utils import timezone  # noqa: E402

from fleet.models import Instance  # noqa: E402
from runs import tokens  # noqa: E402
from runs.models import MetricPoint, Run, RunAttempt  # noqa: E402

POINTS, SMOKE_POINTS, BATCH, CLIENTS = 100_000, 4_000, 500, 4
RECIPE = {"phases": [{"kind": "cpt", "data": "bench", "steps": POINTS}]}  # the API takes only steps a recipe trains


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_runs() -> list[str]:
    """A training run per client on a running box of its own; the token of each run's attempt on it."""
    issued, now = [], timezone.now()
    for i in range(CLIENTS):
        box = Instance.objects.create(provider="vast", idempotency_key=f"bench-ingest-{i}", label=f"bench-ingest-{i}",
                                      state=Instance.State.RUNNING, purpose="training", offer_id=str(i),
                                      gpu_name="H200", image="img", disk_gb=250, requested_at=now, running_at=now,
                                      usd_per_hour=Decimal("1.00"))
        run = Run.objects.create(name=f"bench-{i}", recipe=RECIPE, bucket="/tmp/bench", budget_usd=Decimal(100),
                                 token_nonce=tokens.new_nonce(), created_at=now, state="training",
                                 current_instance=box)
        attempt = RunAttempt.objects.create(run=run, instance=box, started_at=now, token_nonce=tokens.new_nonce())
        issued.append(tokens.issue(attempt, now=now))
    return issued


def post_all(base: str, token: str, first_step: int, count: int, latencies: list) -> None:
    now = datetime.now(UTC).isoformat()
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        for start in range(first_step, first_step + count, BATCH):
            points = [{"phase": 0, "step": s, "at": now, "loss": 2.0, "lr": 1e-4, "step_s": 1.2,
                       "tokens_per_s": 30000.0, "grad_norm_routed": 0.3, "grad_norm_attention": 0.2,
                       "grad_norm_total": 0.36, "routed_b_norm": 1.5, "routed_b_zero": 0, "gpu_mem_gib": 70.0,
                       "kernel_path": "triton"} for s in range(start, min(start + BATCH, first_step + count))]
            t0 = time.perf_counter()
            response = http.post("metrics", json={"points": points})
            latencies.append(time.perf_counter() - t0)
            response.raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_POINTS:,} points")
    total = SMOKE_POINTS if parser.parse_args().smoke else POINTS
    with support.throwaway_database("bench_ingest") as database_url:
        issued = make_runs()
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "gunicorn", "config.wsgi:application", "--bind",
                                   f"127.0.0.1:{port}", "--workers", "2", "--log-level", "warning"],
                                  cwd=support.ROOT, env={**os.environ, "DATABASE_URL": database_url})
        try:
            base = f"http://127.0.0.1:{port}/api/agent/v1/"
            for _ in range(100):
                try:
                    httpx.get(base + "openapi.json", timeout=1)
                    break
                except httpx.TransportError:
                    time.sleep(0.2)
            latencies: list[float] = []
            per_client = total // CLIENTS
            threads = [threading.Thread(target=post_all, args=(base, token, 1, per_client, latencies))
                       for token in issued]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - start
            stored = MetricPoint.objects.count()
            assert stored == total, stored
        finally:
            server.terminate()
            server.wait(10)
    rate = total / elapsed
    print(f"{total} points in {elapsed:.1f} s through the agent API: {rate:,.0f} points/s "
          f"(batches of {BATCH}, {CLIENTS} clients, batch p50 {statistics.median(latencies) * 1000:.0f} ms)")
    print(json.dumps({"points": total, "seconds": round(elapsed, 2), "points_per_s": round(rate),
                      "batch": BATCH, "clients": CLIENTS, "goal_points_per_s": 2000,
                      "batch_p50_ms": round(statistics.median(latencies) * 1000, 1)}))


if __name__ == "__main__":
    main()
