"""The eval phase under chaos, end to end on the simulated marketplace over real HTTP: the real agent, trainer and eval
child run as the simulated boxes' processes and report to a live dashboard. A box killed mid-evaluation is replaced
by one that only evaluates, past the samples already recorded; an eval child that fails ends the run "trained,
evaluation failed". Either way the trained adapter stays in the store, sealed and whole, and nothing is left billing."""

import json
import os
import signal
import time
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils.html import escape

from fleet.models import Instance
from runs import storage
from runs.launch import launch
from runs.models import Run
from tests.marketplace import boxes_reporting_to, running_beat
from training.agent.manifests import CheckpointMismatch, fetch_verified

from .conftest import tiny_recipe

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
TRAINING_STEPS = 4
EVAL_RECORDS = [{"prompt": f"{a} + {a + 7} =", "expected": str(2 * a + 7)} for a in range(10, 18)]
EVAL_FILE = "chaos-eval.jsonl"


@pytest.fixture
def boxes(tmp_path, settings, live_server):
    settings.RENT_OUTCOME_GRACE_S = settings.DESTROY_VERIFY_S = 5
    # Generous heartbeats: a loaded 2-core machine runs the eval child, agent and server.
    with boxes_reporting_to(live_server.url, settings, tmp_path / "boxes", heartbeat_timeout_s=15) as (market, agents):
        yield market, agents


@pytest.fixture
def beat(celery_worker, tmp_path):
    """Real Celery beat sending the instance sync and the supervisor pass every half second to the real worker."""
    with running_beat(celery_worker, tmp_path, ("fleet.tasks.sync_instances", "runs.tasks.supervise_runs")) as service:
        yield service


def _launch(tmp_path, **eval_settings) -> Run:
    """One short CPT phase, then an eval phase on EVAL_FILE (uploaded with the launch)."""
    recipe = tiny_recipe()
    recipe["phases"] = [{**recipe["phases"][0], "steps": TRAINING_STEPS},
                        {"kind": "eval", "data": EVAL_FILE, "scorer": "contains", "max_new_tokens": 16,
                         "batch_size": 1, "time_limit_s": 600, **eval_settings}]
    data = "".join(json.dumps(record) + "\n" for record in EVAL_RECORDS).encode()
    return launch(name="eval-chaos", recipe=recipe, bucket=str(tmp_path / "bucket"), budget_usd=Decimal("20"),
                  max_restarts=3, uploads={EVAL_FILE: SimpleUploadedFile(EVAL_FILE, data)})


def _watch(run, until, on_tick, timeout_s=300):
    """Watches the run while beat and the worker carry it; `on_tick` checks and injects along the way."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run.refresh_from_db()
        on_tick(run)
        if until(run):
            return run
        time.sleep(0.25)
    raise AssertionError(f"run is {run.state} ({run.state_reason[:300]}):\n{_story(run)}")


def _story(run) -> str:
    return "\n".join(f"{e.at:%H:%M:%S.%f} {e.kind}: {e.message[:200]}" for e in run.events.order_by("at", "id"))


def _trained_adapter(run):
    """The last training phase's final checkpoint, once it is complete and sealed; None before."""
    last = run.phases.exclude(kind="eval").order_by("-index").first()
    return run.checkpoints.filter(phase=last.index, step=last.steps, complete=True, rejected_reason="") \
        .exclude(sealed_at=None).first()


def _fetch_adapter(run, into: Path) -> None:
    """Fetches the trained adapter from the run's store as a box that serves or evaluates it does: the files of its
    manifest through a read grant, each checked for its size and sha256 (CheckpointMismatch if one is not)."""
    adapter = _trained_adapter(run)
    grant = storage.download_grant(storage.location(run.bucket, run.pk), adapter.uri, sorted(adapter.manifest), 600)
    fetch_verified({"manifest": adapter.manifest, "download": grant}, into)


def _adapter_watch(run, tmp_path):
    """An on_tick that fetches the trained adapter on every tick once it is banked, and fails the test the first time
    it cannot be fetched whole; returns (the tick, the run's state at each fetch)."""
    fetched = []

    def tick(run):
        if _trained_adapter(run) is None:
            assert not fetched, f"the trained adapter was sealed, then no longer was (run {run.state})"
            return
        try:
            _fetch_adapter(run, tmp_path / "fetched")
        except CheckpointMismatch as exc:
            raise AssertionError(f"the trained adapter could not be fetched while the run was {run.state}: {exc}\n"
                                 f"{_story(run)}") from None
        fetched.append(run.state)

    return tick, fetched


def _box_folder(agents, attempt) -> Path:
    return agents.folder(int(attempt.instance.provider_instance_id))


def _written(agents, attempt) -> set[int]:
    """The sample indices the eval child on the attempt's box has written to its samples file so far."""
    path = _box_folder(agents, attempt) / "work" / "eval-samples.jsonl"
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    return {json.loads(line)["index"] for line in lines if line.endswith("\n")}


def _eval_child(agents, attempt) -> int:
    """The process id of the eval child on the attempt's box (in its box's process session)."""
    session = agents.processes[int(attempt.instance.provider_instance_id)].pid
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if os.getsid(int(entry.name)) == session and b"training.evaluation" in (entry / "cmdline").read_bytes():
                return int(entry.name)
        except OSError:  # the process ended meanwhile
            continue
    raise AssertionError(f"no eval child runs on {attempt.instance.label}")


def _served_first(client, run) -> str:
    """The adapter the Serve page offers first (the route a user takes the trained adapter out by)."""
    form = client.get(reverse("run_serve", args=[run.pk])).context["form"]
    return form.fields["checkpoint"].choices[0][1]


def _nothing_billing(run, market):
    run_boxes = Instance.objects.filter(run_attempts__run=run)
    deadline = time.monotonic() + 60
    while run_boxes.filter(state__in=Instance.LIVE_STATES).exists() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not run_boxes.filter(state__in=Instance.LIVE_STATES).exists(), list(run_boxes.values("label", "state"))
    assert all(i["state"] in ("destroyed", "dead") or not i.get("listed", True) for i in market.state()["instances"])


def test_a_box_killed_mid_evaluation_is_replaced_by_one_that_evaluates_only_the_rest(boxes, beat, tmp_path, client,
                                                                                       operator):
    market, agents = boxes
    run = _launch(tmp_path)
    check_adapter, fetched = _adapter_watch(run, tmp_path)
    chaos = {}  # what the box had written when its eval child was paused, then what was recorded when it was killed

    def tick(run):
        check_adapter(run)
        if "killed" in chaos or run.state != "evaluating":
            return
        box = run.attempts.get(ended_at=None)
        written = _written(agents, box)
        if "written" not in chaos and written:
            # The eval child is paused once it wrote a sample, so that the kill lands mid-evaluation however fast
            # this machine generates; its agent goes on forwarding what was written and beating.
            os.kill(_eval_child(agents, box), signal.SIGSTOP)
            chaos["written"] = _written(agents, box)
        elif "written" in chaos:
            evaluation = run.evaluations.get(number=0)
            recorded = set(evaluation.samples.values_list("index", flat=True))
            if recorded >= chaos["written"]:
                market.kill_host(int(box.instance.provider_instance_id), vanish_after_s=0)
                chaos.update(killed=recorded, evaluation=evaluation.state, fetches=len(fetched))

    run = _watch(run, until=lambda r: not r.is_active, on_tick=tick)
    story = _story(run)
    assert run.state == "finished", f"{run.state_reason}\n{story}"
    assert "killed" in chaos, story
    assert chaos["evaluation"] == "running" and 0 < len(chaos["killed"]) < len(EVAL_RECORDS), chaos
    assert run.attempts.count() == 2 and run.restarts == 1, story
    first, second = run.attempts.order_by("started_at", "id")

    # The new box only evaluated: no trainer ran on it, it reported no step and wrote no checkpoint, and each phase's
    # step was trained once, on the first box.
    assert not (_box_folder(agents, second) / "work" / "trainer.log").exists()
    assert not run.metrics.filter(instance=second.instance).exists()
    assert not run.checkpoints.filter(written_by=second).exists()
    assert not run.checkpoints.filter(created_at__gte=second.started_at).exists()
    steps = list(run.metrics.filter(phase=0, instance=first.instance).order_by("step").values_list("step", flat=True))
    assert steps == list(range(1, TRAINING_STEPS + 1)) and run.metrics.count() == TRAINING_STEPS

    # It was told which samples the dead box had recorded, and its eval child answered only the others.
    work = _box_folder(agents, second) / "work"
    told = set(json.loads((work / "eval-done.json").read_text()))
    answered = [json.loads(line)["index"] for line in (work / "eval-samples.jsonl").read_text().splitlines()]
    evaluation = run.evaluations.get(number=0)
    by_first = set(evaluation.samples.filter(recorded_at__lt=second.started_at).values_list("index", flat=True))
    assert told == by_first == chaos["killed"]
    assert len(answered) == len(set(answered)) and not told & set(answered)
    assert told | set(answered) == set(range(len(EVAL_RECORDS)))

    # The result is the whole eval file's, each record once, and the run page shows it.
    samples = list(evaluation.samples.order_by("index").values("index", "prompt", "expected"))
    assert samples == [{"index": i, "prompt": r["prompt"], "expected": r["expected"]}
                       for i, r in enumerate(EVAL_RECORDS)]
    assert evaluation.state == "finished" and evaluation.samples_expected == len(EVAL_RECORDS)
    assert evaluation.wins + evaluation.ties + evaluation.losses == len(EVAL_RECORDS)
    client.force_login(operator)
    page = client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert "Wins / ties / losses" in page and f"of {len(EVAL_RECORDS)}</td>" in page

    # The trained adapter could be fetched whole on every tick from its banking on, through the kill and the
    # recovery, and the Serve page offers it.
    before, after = fetched[:chaos["fetches"]], fetched[chaos["fetches"]:]
    assert "evaluating" in before and after[-1] == "finished" and len(after) > 1, fetched
    assert _served_first(client, run) == f"cpt (phase 1), step {TRAINING_STEPS}"
    _nothing_billing(run, market)


def test_an_eval_child_that_fails_ends_the_run_trained_with_its_adapter(boxes, beat, tmp_path, client, operator):
    market, agents = boxes
    # A GRPO reward function taken for a scorer: it reads the record's `answer`, which an eval record does not have,
    # so the eval child raises on its first sample.
    run = _launch(tmp_path, scorer="training.examples.rewards:contains_answer")
    check_adapter, fetched = _adapter_watch(run, tmp_path)

    run = _watch(run, until=lambda r: not r.is_active, on_tick=check_adapter)
    story = _story(run)
    assert run.state == "eval_failed", f"{run.state_reason}\n{story}"
    assert run.attempts.count() == 1 and run.restarts == 0, story
    # The reason is the child's own words, not the log of warnings the libraries print before them.
    reason = "The evaluation exited with 2: record 1: the scorer training.examples.rewards:contains_answer raised " \
             "KeyError: 'answer'"
    assert run.state_reason == reason
    evaluation = run.evaluations.get(number=0)
    assert evaluation.state == "failed" and evaluation.reason == reason
    assert not evaluation.samples.exists()

    client.force_login(operator)
    page = client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert "trained, evaluation failed" in page and escape(reason) in page
    assert "Serve this adapter" in page
    assert "evaluating" in fetched and fetched[-1] == "eval_failed", fetched
    assert _served_first(client, run) == f"cpt (phase 1), step {TRAINING_STEPS}"
    _nothing_billing(run, market)
