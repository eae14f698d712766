"""One probe round over 500 serving boxes: how long it takes against the goal of one probe timeout + 0.5 s.

Starts 500 HTTP endpoints on loopback in a separate process (one asyncio server per port: most healthy, some slower
than the probe timeout, some answering 500, some dead: a closed port), writes 500 serving Instance rows pointing at
them into a throwaway PostgreSQL database of this process's own (bench/support.py), runs one round of
fleet.inference.probes.probe_serving_instances, and prints a human line, then a last line of JSON.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fleet python bench/probes.py [--all-slow --concurrency 500]

Options: --endpoints N, --timeout S (default: settings.PROBE_TIMEOUT_S), --concurrency N (settings.PROBE_CONCURRENCY),
--all-slow (every endpoint answers only after the timeout: the goal then needs a concurrency of at least N),
--smoke (20 endpoints, a 1 s timeout).
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "bench/Qwen3-30B-A3B"
BODY = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "vllm"}]}).encode()
SHARES = {"healthy": 0.70, "slow": 0.10, "error": 0.10, "dead": 0.10}


def kinds_for(n: int, all_slow: bool = False) -> list[str]:
    """Interleaved, so the slow ones are spread through the round rather than bunched at its end."""
    if all_slow:
        return ["slow"] * n
    counts = {kind: int(n * share) for kind, share in SHARES.items()}
    counts["healthy"] += n - sum(counts.values())
    kinds, pool = [], dict(counts)
    while len(kinds) < n:
        for kind in SHARES:
            if pool[kind]:
                kinds.append(kind)
                pool[kind] -= 1
    return kinds


def _raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def serve(kinds: list[str], slow_s: float, ready) -> None:
    """The endpoints' process: one listening socket per live endpoint, a tiny HTTP/1.1 responder on each."""
    _raise_fd_limit(len(kinds) * 4 + 100)

    def responder(kind):
        async def handle(reader, writer):
            try:
                await reader.readuntil(b"\r\n\r\n")
                if kind == "slow":
                    await asyncio.sleep(slow_s)
                status, body = ("500 Internal Server Error", b"boom") if kind == "error" else ("200 OK", BODY)
                writer.write(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
                             f"\r\nConnection: close\r\n\r\n".encode() + body)
                await writer.drain()
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()
        return handle

    async def main():
        ports = {}
        for i, kind in enumerate(kinds):
            if kind != "dead":
                server = await asyncio.start_server(responder(kind), "127.0.0.1", 0, backlog=64)
                ports[i] = server.sockets[0].getsockname()[1]
        # Dead ports last, all bound at once and then closed: no live server can be given one of them.
        dead = [(i, socket.socket()) for i, kind in enumerate(kinds) if kind == "dead"]
        for i, s in dead:
            s.bind(("127.0.0.1", 0))
            ports[i] = s.getsockname()[1]
        for _, s in dead:
            s.close()
        ready.send([ports[i] for i in range(len(kinds))])
        await asyncio.Event().wait()

    asyncio.run(main())


def _measure(kinds: list[str], receive):
    """One round against the endpoints, in the throwaway database: (report, seconds, queries, misjudged boxes)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    if not receive.poll(60):
        sys.exit("the endpoints did not start")
    ports = receive.recv()
    from fleet.inference import probes
    from fleet.models import InferenceModel, Instance, ProbeResult

    model = InferenceModel.objects.create(name=MODEL, image="vllm/vllm-openai:bench", port=8000)
    now = timezone.now()
    Instance.objects.bulk_create([
        Instance(provider="vast", provider_instance_id=str(9_000_000 + i), idempotency_key=f"bench-probe-{i}",
                 label=f"bench-{kind}-{i}", state=Instance.State.RUNNING, purpose="serving", offer_id=str(i),
                 gpu_name="H100 SXM", image=model.image, disk_gb=250, requested_at=now, running_at=now,
                 serving_model=model, public_ip="127.0.0.1", ports={"8000/tcp": port}, last_process_at=now)
        for i, (kind, port) in enumerate(zip(kinds, ports, strict=True))])

    with CaptureQueriesContext(connection) as queries:
        started = time.perf_counter()
        report = probes.probe_serving_instances()
        round_s = time.perf_counter() - started
    ok_by_kind = {kind: 0 for kind in SHARES}
    for label in ProbeResult.objects.filter(ok=True).values_list("instance__label", flat=True):
        ok_by_kind[label.split("-")[1]] += 1
    wrong = ok_by_kind["slow"] + ok_by_kind["error"] + ok_by_kind["dead"] + (
        kinds.count("healthy") - ok_by_kind["healthy"])
    return report, round_s, queries, wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--endpoints", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--all-slow", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="20 endpoints, a 1 s timeout")
    args = parser.parse_args()
    if args.smoke:
        args.endpoints, args.timeout = 20, 1.0
    _raise_fd_limit(args.endpoints * 4 + 100)
    sys.path.insert(0, str(ROOT))
    from bench import support

    support.setup_django("probes", PROBE_ALLOW_PRIVATE_ADDRESSES="1")  # the endpoints are on loopback

    from django.conf import settings

    if args.timeout:
        settings.PROBE_TIMEOUT_S = args.timeout
    if args.concurrency:
        settings.PROBE_CONCURRENCY = args.concurrency
    timeout_s = settings.PROBE_TIMEOUT_S
    kinds = kinds_for(args.endpoints, args.all_slow)

    receive, send = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.get_context("fork").Process(target=serve, args=(kinds, timeout_s + 2, send), daemon=True)
    server.start()
    try:
        with support.throwaway_database("bench_probes"):
            report, round_s, queries, wrong = _measure(kinds, receive)
    finally:
        server.terminate()
        server.join(5)

    goal_s = timeout_s + 0.5
    result = {
        "endpoints": len(kinds), "round_s": round(round_s, 3), "timeout_s": timeout_s, "goal_s": goal_s,
        "met": round_s <= goal_s, "ok": report.ok, "failed": report.failed,
        "kinds": {kind: kinds.count(kind) for kind in SHARES}, "misjudged": wrong,
        "concurrency": settings.PROBE_CONCURRENCY, "queries": len(queries), "cpus": os.cpu_count(),
    }
    print(f"probed {len(kinds)} endpoints in {round_s:.2f} s (goal <= {goal_s:g} s: "
          f"{'met' if result['met'] else 'NOT met'}); {report.ok} ok, {report.failed} failed, {wrong} misjudged; "
          f"{len(queries)} queries; timeout {timeout_s:g} s, concurrency {settings.PROBE_CONCURRENCY}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
