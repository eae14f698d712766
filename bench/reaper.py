"""One reaper pass over 1,000 (and 2,000) instances in PostgreSQL: wall time and number of queries.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fleet python bench/reaper.py [--smoke]

Creates a throwaway test database, fills it with live instances of which a fixed number must be reaped (too old,
idle, failing probes, hung, over the spend cap), times `fleet.reaper.sweep.reap` (median of several passes, the reaped
rows reset between passes: back to running, as before the pass moved them to stopping) and counts its queries. The
last line is JSON. --smoke: 100 and 200 instances, 2 passes each (a check that the benchmark runs, not a figure).
"""

import argparse
import json
import statistics
import time
from datetime import timedelta
from decimal import Decimal

import support

support.setup_django("reaper")

from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from fleet.reaper import sweep  # noqa: E402
from fleet.models import Instance  # noqa: E402

REPEAT = 5
TO_REAP = 10


def fill(count: int) -> None:
    now = timezone.now()
    rows = []
    for i in range(count):
        healthy = dict(running_at=now - timedelta(hours=2), last_process_at=now, last_step_at=now,
                       gpu_last_ok_at=now, gpu_util_percent=95.0)
        kind = i % (count // TO_REAP) == 0  # a fixed number of condemned boxes, whatever the count
        if kind:
            healthy.update(running_at=now - timedelta(hours=13), last_step_at=now - timedelta(hours=2))
        rows.append(Instance(provider="vast", provider_instance_id=str(10_000_000 + i), idempotency_key=f"bench-{i}",
                             label=f"moe-fleet-bench-{i}", state=Instance.State.RUNNING, purpose="training",
                             offer_id=str(i), gpu_name="H200", image="img", disk_gb=250, requested_at=now,
                             usd_per_hour=Decimal("0.0010"), **healthy))
    Instance.objects.bulk_create(rows, batch_size=1000)


def measure(count: int, repeat: int) -> dict:
    Instance.objects.all().delete()
    fill(count)
    times, queries = [], []
    for _ in range(repeat):
        Instance.objects.update(reaped_at=None, reap_reason="", state=Instance.State.RUNNING, destroy_reason="",
                                destroy_requested_at=None)
        with CaptureQueriesContext(connection) as captured:
            start = time.perf_counter()
            report = sweep.reap()
            times.append(time.perf_counter() - start)
        queries.append(len(captured.captured_queries))
        assert len(report.acted) == TO_REAP, report.acted
    return {"instances": count, "median_ms": round(statistics.median(times) * 1000, 1),
            "max_ms": round(max(times) * 1000, 1), "queries": max(queries), "reaped": TO_REAP}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="100 and 200 instances, 2 passes each")
    args = parser.parse_args()
    counts, repeat = ((100, 200), 2) if args.smoke else ((1000, 2000), REPEAT)
    with support.throwaway_database("bench_reaper"):
        results = [measure(count, repeat) for count in counts]
    for r in results:
        print(f"{r['instances']:>5} instances: reaper pass median {r['median_ms']} ms (max {r['max_ms']} ms), "
              f"{r['queries']} queries, {r['reaped']} reaped")
    first, second = results
    print(json.dumps({"instances": first["instances"], "median_ms": first["median_ms"], "queries": first["queries"],
                      f"queries_at_{second['instances']}": second["queries"],
                      f"median_ms_at_{second['instances']}": second["median_ms"],
                      "goal_ms": 1000, "constant_queries": first["queries"] == second["queries"]}))


if __name__ == "__main__":
    main()
