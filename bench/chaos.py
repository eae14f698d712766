"""Chaos on the simulated marketplace: rents and runs with a fault injected at every step that can crash, then the
product's own periodic passes, and an audit of what the marketplace bills for against what the dashboard knows.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fleet python bench/chaos.py [--rounds 20] [--seed 7] [--smoke]

Real parts: PostgreSQL (a throwaway database of this process), the simulated marketplace over HTTP with its clock
moved by the bench, a real Celery worker process taking the hand-overs (destroys, rents, moves) from the broker, and
the beat's periodic work (instance sync, rent sweep, supervisor, reaper) run by the bench at a fast tempo on the
marketplace's clock. A fault is a worker killed at one point (an exception nothing in the product catches, raised
where the kill would land), a broker that refuses hand-overs, passes that overlap in threads, a box killed or hung
mid-upload, a stale or forged token, a tampered checkpoint, malformed offers in a search answer, destroys the
marketplace refuses while the spend cap is crossed, a dashboard that goes silent (or refuses a box) while serving
boxes check in (their watchdog, training/agent/serving_watchdog.py, run on the marketplace's clock), or a replaced box
that keeps writing with the upload grant it held.

After each scenario the audit counts, at the marketplace and in the database:
    orphaned_boxes                a machine the marketplace bills for that no live row of the dashboard tracks
    double_rents                  more than one machine for one row, or more than one live box for one run
    boxes_outside_reaper          a live billing row that the reaper's snapshot does not cover
    lost_offers                   a well-formed offer missing from the store after a refresh with bad neighbours
    unverified_checkpoints_loaded a resume that put files into the trainer's store that do not match their manifest
    hostile_posts_accepted        a post with a stale, foreign or forged token that the agent API answered with 2xx
    healthy_boxes_shed_beyond_cap a box the spend cap destroyed beyond those its crossing required (destroys lagging)
    serving_boxes_billing_past_window  a serving box whose GPU still bills the dead-man window and a margin after its
                                  dashboard went silent (or a check-in refused it)
    checkpoints_refused_by_successors  a box that refused a checkpoint it was offered (or resumed from another) after
                                  a replaced box kept writing with its old upload grant
    honest_completes_refused      an honest box's 'complete' the agent API refused (a replaced box writing meanwhile)
The last line is JSON; the goal is scenarios >= 250 and every count 0. --smoke: each scenario once.
"""

import argparse
import functools
import hashlib
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import contextmanager
from types import SimpleNamespace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from unittest import mock

import httpx
import support

support.setup_django("chaos", RENT_QUEUE_GRACE_S="60", RENT_OUTCOME_GRACE_S="60", AGENT_HEARTBEAT_TIMEOUT_S="60",
                     REAPER_MAX_AGE_HOURS="6", PROVIDER_MAX_RETRIES="1")

from django.conf import settings  # noqa: E402
from django.db import connections  # noqa: E402
from django.test import Client  # noqa: E402
from kombu.exceptions import OperationalError  # noqa: E402

from fleet import actions, enqueue  # noqa: E402
from fleet.inference import replicas  # noqa: E402
from fleet.models import InferenceModel, Instance, Offer  # noqa: E402
from fleet.offers.refresh import refresh_offers  # noqa: E402
from fleet.reaper import sweep  # noqa: E402
from fleet.simulator import SimulatedMarketplace  # noqa: E402
from runs import supervisor, tokens  # noqa: E402
from runs.launch import example_recipe, launch  # noqa: E402
from runs.models import Run, RunAttempt  # noqa: E402
from training import agent  # noqa: E402
from training.agent import serving_watchdog  # noqa: E402

KEY = "chaos-key"
API = "/api/agent/v1"
State = Instance.State


class Killed(BaseException):
    """A worker killed at this point: nothing in the product catches it, as nothing catches a SIGKILL."""


def killed(*args, **kwargs):
    raise Killed()


class Chaos:
    def __init__(self, seed: int, data_dir: Path):
        self.rng = random.Random(seed)
        self.data_dir = data_dir
        self.market = SimulatedMarketplace(api_key=KEY, seed=seed, speed=0, boot_delay_s=30, port=0,
                                           charges_min_interval_s=0).start()
        settings.VAST_API_URL, settings.VAST_API_KEY = self.market.base_url, KEY
        settings.LOCAL_BUCKETS = True  # the simulated boxes run on this machine, beside the bucket
        self.counts = Counter()
        self.scenarios = Counter()
        self.failures: list[str] = []

    # -- time and the beat ---------------------------------------------------------------------------------------

    def clock(self) -> float:
        return self.market.market.clock.now()  # what state()["clock"] says, without building the whole state

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), tz=UTC)

    def passes(self, rounds: int = 4, step_s: float = 45) -> None:
        """The beat's periodic work, `rounds` times, the marketplace's clock moving `step_s` between them; the worker
        process gets a moment for what was handed over."""
        for _ in range(rounds):
            self.market.advance(step_s)
            now = self.now()
            for work in (actions.sync, actions.rent_waiting, supervisor.supervise,
                         functools.partial(sweep.reap, dry_run=False)):
                try:
                    work(now=now)
                except Exception as exc:  # noqa: BLE001 - a pass that fails is retried by the next, as on beat
                    self.failures.append(f"periodic pass: {type(exc).__name__}: {exc}"[:200])
            wait_for_worker()

    # -- the audit ----------------------------------------------------------------------------------------------

    def audit(self, name: str) -> None:
        machines = [i for i in self.market.state()["instances"] if i["destroyed_at"] is None and i["state"] != "dead"]
        rows = {row.label: row for row in Instance.objects.all()}
        # After the passes, a machine that bills must be a row's own, and that row must bill too: a row still
        # "requested" beside a machine (a rent the dashboard never learnt of) counts as an orphan.
        tracked = {row.provider_instance_id for row in rows.values() if row.state in Instance.BILLING_STATES}
        per_label = Counter(m["label"] for m in machines)
        orphans = [m["label"] for m in machines if str(m["id"]) not in tracked]
        doubles = [label for label, n in per_label.items() if n > 1]
        for run in Run.objects.all():
            boxes = Instance.objects.filter(run_attempts__run=run, state__in=Instance.BILLING_STATES).distinct()
            if boxes.count() > 1:
                doubles.append(f"run {run.pk}")
        covered = {s.pk for s in sweep.snapshots()}
        outside = [row.label for row in rows.values() if row.state in (State.PROVISIONING, State.RUNNING)
                   and row.pk not in covered]
        for key, found in (("orphaned_boxes", orphans), ("double_rents", doubles),
                           ("boxes_outside_reaper", outside)):
            if found:
                self.counts[key] += len(found)
                self.failures.append(f"{name}: {key}: {found[:3]}")

    def tear_down(self) -> None:
        """Everything rented is destroyed the way a person would (forced), then the passes make it so."""
        for row in Instance.objects.filter(state__in=Instance.LIVE_STATES):
            actions.request_destroy(row, reason="chaos: end of scenario", now=self.now())
            actions.destroy(row, reason="chaos: end of scenario", now=self.now())
        Run.objects.filter(state__in=Run.ACTIVE_STATES).update(state="cancelled", state_reason="end of scenario")
        self.passes(rounds=2)
        # Each scenario starts from nothing: the marketplace back to its catalogue, the database's rows gone.
        Run.objects.all().delete()
        Instance.objects.all().delete()
        InferenceModel.objects.all().delete()
        self.market.reset()
        refresh_offers()

    def scenario(self, name: str, body) -> None:
        self.scenarios[name] += 1
        try:
            body()
        except Exception as exc:  # noqa: BLE001 - a scenario that errors is reported, and the audit still runs
            self.failures.append(f"{name}: {type(exc).__name__}: {exc}"[:300])
        self.passes(rounds=4)
        self.audit(name)
        self.tear_down()

    # -- what the scenarios share -------------------------------------------------------------------------------

    def offer(self) -> Offer:
        offers = list(Offer.objects.filter(is_bid=False, provider="vast", disk_gb__gte=settings.RENT_DISK_GB)
                      .order_by("gpu_usd_per_hour")[:20])
        return self.rng.choice(offers)

    def run(self, name: str) -> Run:
        recipe = example_recipe()
        recipe["phases"] = [dict(phase, steps=50) for phase in recipe["phases"][:1]]
        bucket = self.data_dir / "buckets" / f"{name}-{self.rng.randrange(10**9)}"
        return launch(name=name, recipe=recipe, bucket=str(bucket), budget_usd=Decimal(20), max_restarts=3)

    def token_of(self, run: Run) -> str:
        """The token the marketplace's box received in its environment."""
        run.refresh_from_db()
        label = run.current_instance.label
        return next(i["env"]["FLEET_AGENT_TOKEN"] for i in self.market.state()["instances"] if i["label"] == label)

    def started(self, name: str) -> tuple[Run, Client]:
        run = self.run(name)
        for _ in range(5):  # asked for, rented, attached: as many passes as that takes
            supervisor.supervise(now=self.now())
            run.refresh_from_db()
            if run.current_instance and run.current_instance.provider_instance_id:
                break
            self.market.advance(5)
        else:
            raise RuntimeError(f"run {run.pk} got no box: {run.state_reason}")
        client = Client(HTTP_AUTHORIZATION=f"Bearer {self.token_of(run)}")
        post(client, "/heartbeat", {"state": "installing"})
        post(client, "/events", {"kind": "probe_ok", "message": "probe ok"})
        return run, client


def in_thread(target, **kwargs) -> threading.Thread:
    """A pass in a thread of its own, as another worker would run it, with its own database connection."""
    def work():
        try:
            target(**kwargs)
        finally:
            connections.close_all()
    return threading.Thread(target=work)


def post(client: Client, path: str, body: dict):
    return client.post(API + path, json.dumps(body), content_type="application/json")


def wait_for_worker(limit_s: float = 3.0) -> None:
    """Until the broker's queues are empty (the worker took every hand-over) or the limit passes."""
    deadline = time.monotonic() + limit_s
    folder = Path(os.environ["DATA_DIR"]) / "celery-broker"
    while time.monotonic() < deadline:
        pending = [p for p in folder.rglob("*") if p.is_file() and p.suffix == ".msg"] if folder.exists() else []
        if not pending:
            return
        time.sleep(0.05)


@contextmanager
def broker_down():
    """Every hand-over refused as an unreachable broker refuses it (kombu's OperationalError)."""
    def refuse(*args, **kwargs):
        raise OperationalError("chaos: the broker is down")
    with mock.patch.object(enqueue, "current_app", mock.Mock(send_task=refuse)):
        yield


def store_checkpoint(client: Client, step: int, data: bytes) -> dict:
    """A checkpoint a box uploads honestly through its upload grant (its attempt's folder), and its notice."""
    uri = f"ckpt-p00-s{step:08d}"
    files = {"adapter/adapter_model.safetensors": data, "trainer.pt": data[::-1]}
    write_with_grant(upload_grant(client), uri, files)
    manifest = {name: {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()} for name, body in files.items()}
    return {"phase": 0, "step": step, "uri": uri, "complete": True, "manifest": manifest}


def upload_grant(client: Client) -> dict:
    """The upload grant a heartbeat answer brings the box (a folder: the simulated boxes' store is local)."""
    return post(client, "/heartbeat", {"state": "training", "process_alive": True}).json()["upload"]


def write_with_grant(grant: dict, uri: str, files: dict[str, bytes]) -> None:
    """What a box writes with a grant: only under the folder it names, as a presigned POST's policy holds it."""
    root = Path(grant["path"]) / uri
    for name, body in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(body)


def sealed_folder(run: Run, uri: str) -> Path:
    return Path(run.bucket) / "runs" / str(run.pk) / uri


# -- the scenarios ---------------------------------------------------------------------------------------------------


def killed_before_the_rent_call(chaos: Chaos) -> None:
    """A person's rent: the row is written, its worker dies before the call; the task arrives later all the same."""
    instance, _ = actions.request_rent(offer=chaos.offer(), idempotency_key=f"manual-{chaos.rng.random()}",
                                       now=chaos.now())
    chaos.passes(rounds=3)  # the rent sweep rents it after its grace
    actions.rent(instance.pk, now=chaos.now())  # the lost task, delivered late


def killed_after_the_claim(chaos: Chaos) -> None:
    """The worker claimed the row and died before the provider heard of it."""
    rent_dying(chaos, "claimed", mock.patch("fleet.providers.vast.VastClient.rent", killed))


def killed_after_the_provider_rented(chaos: Chaos) -> None:
    """The machine exists at the marketplace; the worker died before the row learnt of it."""
    rent_dying(chaos, "rented", mock.patch.object(actions, "_attach", killed))


def rent_dying(chaos: Chaos, name: str, death) -> None:
    """A person's rent whose worker dies where `death` (a patch raising Killed) puts it."""
    instance, _ = actions.request_rent(offer=chaos.offer(), idempotency_key=f"{name}-{chaos.rng.random()}",
                                       now=chaos.now())
    with death:
        try:
            actions.rent(instance.pk, now=chaos.now())
        except Killed:
            pass


def broker_down_at_the_reapers_hand_over(chaos: Chaos) -> None:
    instance, _ = actions.request_rent(offer=chaos.offer(), idempotency_key=f"old-{chaos.rng.random()}",
                                       now=chaos.now())
    actions.rent(instance.pk, now=chaos.now())
    chaos.passes(rounds=1)
    chaos.market.advance(7 * 3600)  # past the age limit
    with broker_down():
        sweep.reap(now=chaos.now(), dry_run=False)


def broker_down_at_a_manual_rent(chaos: Chaos) -> None:
    """The rent page's path: the row is saved, the hand-over refused; the person clicks again."""
    offer, key = chaos.offer(), f"click-{chaos.rng.random()}"
    for _ in range(2):
        instance, created = actions.request_rent(offer=offer, idempotency_key=key, now=chaos.now())
        with broker_down():
            try:
                enqueue.rent_instance(instance.pk)
            except enqueue.QueueUnavailable:
                pass


def overlapping_supervisor_passes(chaos: Chaos) -> None:
    chaos.run("overlap")
    now = chaos.now()
    threads = [in_thread(supervisor.supervise, now=now) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def supervisor_and_reaper_on_a_hung_box(chaos: Chaos) -> None:
    run, client = chaos.started("hung")
    post(client, "/metrics", {"points": [{"phase": 0, "step": 1, "loss": 2.0, "step_s": 1.0}]})
    chaos.market.hang_host(int(run.current_instance.provider_instance_id))
    chaos.market.advance(3600)
    now = chaos.now()
    threads = [in_thread(supervisor.supervise, now=now), in_thread(sweep.reap, now=now, dry_run=False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def box_killed_mid_upload(chaos: Chaos) -> None:
    """Half a checkpoint reaches the store and the host dies: the next box must not be offered it."""
    run, client = chaos.started("upload")
    notice = store_checkpoint(client, 10, os.urandom(256))
    post(client, "/checkpoints", {**notice, "complete": False})
    (Path(upload_grant(client)["path"]) / notice["uri"] / "trainer.pt").unlink()
    post(client, "/checkpoints", notice)  # a box that lies: declared complete with a file missing
    chaos.market.kill_host(int(run.current_instance.provider_instance_id))
    chaos.passes(rounds=4)
    run.refresh_from_db()
    if run.current_instance_id:
        spec = Client(HTTP_AUTHORIZATION=f"Bearer {chaos.token_of(run)}").get(API + "/spec").json()
        chaos.counts["unverified_checkpoints_loaded"] += sum(1 for c in spec.get("resume", [])
                                                             if c["uri"] == notice["uri"])


def tampered_checkpoint(chaos: Chaos) -> None:
    """A complete checkpoint is changed afterwards (a stale box with a grant): the next box must refuse it."""
    run, client = chaos.started("tamper")
    older, newer = store_checkpoint(client, 5, os.urandom(300)), store_checkpoint(client, 10, os.urandom(300))
    for notice in (older, newer):
        post(client, "/checkpoints", notice)
    (sealed_folder(run, newer["uri"]) / "trainer.pt").write_bytes(b"import os; os.system('x')")  # in the store itself
    spec = client.get(API + "/spec").json()
    store = Path(tempfile.mkdtemp(prefix="chaos-store-"))
    api = agent.Api("http://unused/", "unused")
    api.call = lambda method, path, body=None: post(client, "/" + path, body).json()
    chosen = agent.restore(api, spec["resume"], store)
    for folder in store.iterdir():
        manifest = next(c["manifest"] for c in spec["resume"] if c["uri"] == folder.name)
        if agent.manifest_of(folder) != manifest or (chosen and chosen["uri"] == newer["uri"]):
            chaos.counts["unverified_checkpoints_loaded"] += 1


def hostile_posts(chaos: Chaos) -> None:
    """A replaced box, a box of another run and a forger post as if they were the current box."""
    run, client = chaos.started("victim")
    stale = client
    chaos.market.kill_host(int(run.current_instance.provider_instance_id))
    chaos.passes(rounds=4)  # the run moves to a new box
    other, _ = chaos.started("other")
    forged = Client(HTTP_AUTHORIZATION="Bearer run_" + "x" * 40)
    attempt = RunAttempt.objects.filter(run=run).order_by("-id").first()
    guessed = Client(HTTP_AUTHORIZATION=f"Bearer {tokens._SIGNER.sign(f'{run.pk}.x.{attempt.pk}.y')}")
    for hostile in (stale, forged, guessed):
        for path, body in (("/heartbeat", {"state": "training", "process_alive": True, "gpu_util_percent": 90}),
                           ("/metrics", {"points": [{"phase": 0, "step": 99, "loss": 0.1}]}),
                           ("/events", {"kind": "finished", "message": "done, honest"}),
                           ("/checkpoints", {"phase": 0, "step": 1, "uri": "evil", "complete": False})):
            if post(hostile, path, body).status_code < 400:
                chaos.counts["hostile_posts_accepted"] += 1
    if run.metrics.filter(step=99).exists() or other.metrics.filter(step=99).exists():
        chaos.counts["hostile_posts_accepted"] += 1


def spend_cap_while_destroys_lag(chaos: Chaos) -> None:
    """Healthy boxes, then a cap below their spend while the marketplace refuses every destroy: the cap sheds the
    newest boxes it must, once, and no more pass after pass while those destroys stay overdue."""
    offers = list(Offer.objects.filter(is_bid=False, provider="vast", disk_gb__gte=settings.RENT_DISK_GB,
                                       cuda_max__gte=settings.WORKER_IMAGE_CUDA).order_by("gpu_usd_per_hour")[:30])
    rows = []
    for offer in chaos.rng.sample(offers, chaos.rng.randint(3, 7)):
        instance, _ = actions.request_rent(offer=offer, idempotency_key=f"cap-{chaos.rng.random()}", now=chaos.now())
        rows.append(actions.rent(instance.pk, now=chaos.now()))
        chaos.market.advance(chaos.rng.uniform(1, 20))
    chaos.passes(rounds=1)  # booted and synced: healthy boxes, all billing
    live = sorted(Instance.objects.filter(pk__in=[r.pk for r in rows], state=State.RUNNING),
                  key=lambda r: (r.requested_at, r.pk))
    if len(live) < 2:
        raise RuntimeError(f"{len(live)} of {len(rows)} boxes run: " + ", ".join(
            f"{r.state} {r.failure_reason[:80]}" for r in Instance.objects.filter(pk__in=[r.pk for r in rows])))
    kept = chaos.rng.randint(1, len(live) - 1)
    cap = sum((r.usd_per_hour for r in live[:kept]), Decimal(0)) + Decimal("0.01")
    spend, required = sum((r.usd_per_hour for r in live), Decimal(0)), 0
    for row in reversed(live):  # what the cap requires: the newest first, until the spend is under it
        if spend <= cap:
            break
        spend, required = spend - row.usd_per_hour, required + 1
    lagging = [f"/instances/{r.provider_instance_id}/" for r in live]
    for path in lagging:
        chaos.market.inject_faults(http_5xx=10**4, status_5xx=chaos.rng.choice((500, 502, 503)), path_contains=path)
    saved, settings.SPEND_CAP_USD_PER_HOUR = settings.SPEND_CAP_USD_PER_HOUR, cap
    try:
        chaos.passes(rounds=chaos.rng.randint(3, 6))  # the destroys it asked for lag: overdue, billing on
    finally:
        settings.SPEND_CAP_USD_PER_HOUR = saved
        for path in lagging:  # the marketplace recovers: the destroys go through in the passes after this
            while chaos.market.market.take_request_fault(path) is not None:
                pass
    shed = Instance.objects.filter(pk__in=[r.pk for r in live], reap_reason__startswith="spend").count()
    if shed > required:
        chaos.counts["healthy_boxes_shed_beyond_cap"] += shed - required
        chaos.failures.append(f"spend cap: {shed} boxes shed where {required} were required")


class ServingBox:
    """A serving box's watchdog as its start script runs it, on the marketplace's clock, checking in with the
    dashboard in this process and stopping its own machine at the marketplace with its own key."""

    def __init__(self, chaos: Chaos, row: Instance, window_s: float):
        machine = next(m for m in chaos.market.state()["instances"] if m["label"] == row.label)
        self.chaos, self.row, self.env = chaos, row, machine["env"]
        self.machine_env = {"CONTAINER_ID": str(machine["id"]), "CONTAINER_API_KEY": machine["container_api_key"],
                            "FLEET_VAST_API_URL": chaos.market.base_url, "FLEET_SELF_STOP": ""}
        self.watchdog = serving_watchdog.Watchdog(self.env["FLEET_CHECKIN_URL"], self.env["FLEET_CHECKIN_TOKEN"],
                                                  window_s, clock=chaos.clock)
        self.due = chaos.clock()

    def tick(self, dashboard_up: bool) -> None:
        def post(url, json, headers, timeout):
            if not dashboard_up:
                raise httpx.ConnectError("chaos: the dashboard is silent")
            answer = Client(HTTP_AUTHORIZATION=headers["Authorization"]).post(
                "/" + url.split("/", 3)[3], "{}", content_type="application/json")
            return httpx.Response(answer.status_code, content=answer.content)

        transport = SimpleNamespace(post=post, HTTPError=httpx.HTTPError, Response=httpx.Response)
        with mock.patch.object(serving_watchdog, "httpx", transport), mock.patch.dict(os.environ, self.machine_env):
            self.watchdog.tick()
        self.due = self.chaos.clock() + (serving_watchdog.STOP_AGAIN_S if self.watchdog.reason
                                         else float(self.env["FLEET_CHECKIN_S"]))

    def gpu_billing(self) -> bool:
        status = self.chaos.market.market.get_instance(int(self.machine_env["CONTAINER_ID"]))["actual_status"]
        return status not in ("stopped", "exited")  # stopped by its own key, or its host dead: no GPU billing


def serving_dashboard_goes_silent(chaos: Chaos) -> None:
    """Serving boxes check in, then the dashboard goes silent (one box refused first, a stop call lost): every box
    must stop its own machine, and its GPU billing, within the dead-man window and a margin."""
    window_s = 600
    saved, settings.AGENT_DEAD_MAN_WINDOW_S = settings.AGENT_DEAD_MAN_WINDOW_S, window_s
    try:
        model = InferenceModel.objects.create(name=f"chaos/serve-{chaos.rng.randrange(10**6)}",
                                              image="vllm/vllm-openai:v0.11.2", port=8000,
                                              desired_replicas=chaos.rng.randint(1, 3), max_replacements_per_day=5)
        replicas.maintain(now=chaos.now())
        chaos.passes(rounds=1)  # booted and synced
        boxes = [ServingBox(chaos, row, window_s) for row in
                 Instance.objects.filter(serving_model=model, state=State.RUNNING)]
        interval_s = float(boxes[0].env["FLEET_CHECKIN_S"]) if boxes else 15.0
        silent_at = chaos.clock() + chaos.rng.uniform(0, 10) * interval_s
        refused = chaos.rng.choice(boxes) if boxes and chaos.rng.random() < 0.4 else None
        if boxes and chaos.rng.random() < 0.4:  # a stop call the marketplace loses: asked for again
            lost = chaos.rng.choice(boxes).row.provider_instance_id
            chaos.market.inject_faults(http_5xx=1, path_contains=f"/instances/{lost}/")
        if refused is not None:  # its destroy asked for, the call not sent (the broker is down): it must stop itself
            with broker_down():
                try:
                    actions.request_destroy(refused.row, reason="chaos: no longer wanted", now=chaos.now())
                except enqueue.QueueUnavailable:
                    pass
        deadline = silent_at + window_s + interval_s + serving_watchdog.STOP_AGAIN_S
        while chaos.clock() < deadline:
            step = max(1.0, min(box.due for box in boxes) - chaos.clock()) if boxes else interval_s
            chaos.market.advance(step)
            for box in boxes:
                if box.due <= chaos.clock() and box.gpu_billing():
                    box.tick(dashboard_up=chaos.clock() < silent_at)
            for box in [b for b in boxes if b is not refused and b.watchdog.reason and chaos.clock() < silent_at]:
                chaos.failures.append(f"serving box stopped while its dashboard answered: {box.watchdog.reason}")
                boxes.remove(box)
        billing = [box.row.label for box in boxes if box.gpu_billing()]
        if billing:
            chaos.counts["serving_boxes_billing_past_window"] += len(billing)
            chaos.failures.append(f"serving boxes billing past the window: {billing}")
    finally:
        settings.AGENT_DEAD_MAN_WINDOW_S = saved


def replaced_box_keeps_writing(chaos: Chaos) -> None:
    """A box replaced after its host was lost keeps writing with the upload grant it held: over a checkpoint's files
    it recorded, and under the name of the next checkpoint, before and while its successor uploads that one. The
    successor must resume from the recorded checkpoint, and its own honest 'complete' must be accepted."""
    run, client = chaos.started("stale-grant")
    stale = upload_grant(client)
    recorded = store_checkpoint(client, 5, os.urandom(300))
    if post(client, "/checkpoints", recorded).status_code >= 400:
        chaos.counts["honest_completes_refused"] += 1
    chaos.market.kill_host(int(run.current_instance.provider_instance_id))
    chaos.passes(rounds=4)  # the run moves to a new box
    run.refresh_from_db()
    if run.current_instance is None or not run.current_instance.provider_instance_id:
        raise RuntimeError(f"run {run.pk} got no new box: {run.state} {run.state_reason}")
    successor = Client(HTTP_AUTHORIZATION=f"Bearer {chaos.token_of(run)}")
    post(successor, "/heartbeat", {"state": "installing"})
    post(successor, "/events", {"kind": "probe_ok", "message": "probe ok"})
    following = f"ckpt-p00-s{10:08d}"
    planted = {"adapter/adapter_model.safetensors": b"planted", "trainer.pt": b"planted", "extra.bin": os.urandom(64)}
    write_with_grant(stale, recorded["uri"], {name: b"stale" for name in recorded["manifest"]})
    write_with_grant(stale, following, planted)

    spec = successor.get(API + "/spec").json()
    api, refused = agent.Api("http://unused/", "unused"), []

    def call(method, path, body=None):
        if path == "checkpoints/rejected":
            refused.append(body)
        return post(successor, "/" + path, body).json()

    api.call = call
    chosen = agent.restore(api, spec["resume"], Path(tempfile.mkdtemp(prefix="chaos-store-")))
    if refused or chosen is None or chosen["uri"] != recorded["uri"]:
        chaos.counts["checkpoints_refused_by_successors"] += 1
        chaos.failures.append(f"stale grant: the successor resumed from {chosen and chosen['uri']}, refused {refused}")

    notice = store_checkpoint(successor, 10, os.urandom(300))
    write_with_grant(stale, following, planted)  # again, between the successor's upload and its 'complete'
    answer = post(successor, "/checkpoints", notice)
    if answer.status_code >= 400:
        chaos.counts["honest_completes_refused"] += 1
        chaos.failures.append(f"stale grant: an honest complete refused: {answer.status_code} {answer.content[:200]}")


BAD_VALUES = (float("nan"), float("inf"), -1, "12", "false", 1.5, None, 10**30, "x" * 5000, [], {})
FIELDS = ("id", "num_gpus", "gpu_ram", "dph_total", "reliability2", "inet_down", "disk_space", "cuda_max_good",
          "compute_cap", "gpu_name", "verified", "machine_id", "storage_cost", "driver_version")


def malformed_offers(chaos: Chaos) -> None:
    """Some offers of a search answer carry a bad value in one field; every well-formed one must be stored."""
    from fleet.providers import vast

    original = vast.VastClient._json
    answered: set[str] = set()
    spoiled: set[str] = set()

    def answer(self, method, path, **kwargs):
        data = original(self, method, path, **kwargs)
        if path == "/bundles/":
            for raw in data["offers"]:
                answered.add(str(raw["id"]))
                if chaos.rng.random() < 0.2:
                    spoiled.add(str(raw["id"]))
                    raw[chaos.rng.choice(FIELDS)] = chaos.rng.choice(BAD_VALUES)
        return data

    Offer.objects.all().delete()
    with mock.patch.object(vast.VastClient, "_json", answer):
        refresh_offers()
    stored = set(Offer.objects.values_list("offer_id", flat=True))
    chaos.counts["lost_offers"] += len(answered - spoiled - stored)
    refresh_offers()  # a clean refresh for the scenarios after this one


SCENARIOS = [killed_before_the_rent_call, killed_after_the_claim, killed_after_the_provider_rented,
             broker_down_at_the_reapers_hand_over, broker_down_at_a_manual_rent, overlapping_supervisor_passes,
             supervisor_and_reaper_on_a_hung_box, box_killed_mid_upload, tampered_checkpoint, hostile_posts,
             malformed_offers, spend_cap_while_destroys_lag, serving_dashboard_goes_silent, replaced_box_keeps_writing]


def start_worker(database_url: str) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": database_url}
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "config", "--quiet", "worker", "-Q", "fast,slow",
                             "--pool", "solo", "--loglevel", "WARNING", "--without-heartbeat", "--without-gossip",
                             "--without-mingle"], cwd=support.ROOT, env=env)


def main() -> int:
    logging.getLogger("serving-watchdog").setLevel(logging.ERROR)  # a line per silent check-in, by design
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20, help="times each scenario runs")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--only", action="append", choices=[s.__name__ for s in SCENARIOS],
                        help="run only this scenario (repeatable)")
    parser.add_argument("--smoke", action="store_true", help="each scenario once (--rounds 1)")
    args = parser.parse_args()
    if args.smoke:
        args.rounds = 1
    chosen = [s for s in SCENARIOS if not args.only or s.__name__ in args.only]
    with support.throwaway_database(f"chaos_{os.getpid()}") as database_url:
        worker = start_worker(database_url)
        chaos = Chaos(args.seed, Path(os.environ["DATA_DIR"]))
        started = time.monotonic()
        try:
            refresh_offers()
            for _ in range(args.rounds):
                for scenario in chosen:
                    chaos.scenario(scenario.__name__, lambda s=scenario: s(chaos))
        finally:
            chaos.market.stop()
            worker.terminate()
            worker.wait(timeout=30)
        wall_s = time.monotonic() - started
    for line in chaos.failures[:20]:
        print("  " + line)
    summary = {"scenarios": sum(chaos.scenarios.values()), "kinds": len(chaos.scenarios),
               **{key: chaos.counts[key] for key in ("orphaned_boxes", "double_rents", "boxes_outside_reaper",
                                                     "lost_offers", "unverified_checkpoints_loaded",
                                                     "hostile_posts_accepted", "healthy_boxes_shed_beyond_cap",
                                                     "serving_boxes_billing_past_window",
                                                     "checkpoints_refused_by_successors", "honest_completes_refused")},
               "errors": len(chaos.failures), "wall_s": round(wall_s, 1)}
    print(json.dumps(summary))
    return 0 if all(summary[k] == 0 for k in summary if k not in ("scenarios", "kinds", "wall_s")) else 1


if __name__ == "__main__":
    sys.exit(main())
