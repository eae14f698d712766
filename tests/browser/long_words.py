"""A database seeded with the longest names, paths and messages the models allow, owned by an operator and by a
plain user, and the pages each of them reaches: what tests/browser/test_layout_browser.py lays out."""

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

# No space, hyphen or slash to break at: a traceback line, a hash, a name made of underscores.
UNBROKEN = "Traceback:/opt/conda/lib/python3.11/site-packages/torch/distributed/elastic/" + "x" * 220
NAME_80 = "qwen3_235b_a22b_tool_calling_sft_" + "n" * 47
GPU = "RTX PRO 6000 Blackwell Server Edition"
PROFILE = "h200-eu-reliable-" + "p" * 43  # a profile's name is a slug of up to 60 characters
MESSAGE = ("The box stopped answering its heartbeat after the provider moved it to another host; " * 3
           + UNBROKEN)


def seed(operator, member) -> dict:
    """Every kind of row a page lists, each with its longest words; returns the rows the pages are reached by."""
    from fleet.alerts import notify
    from fleet.models import (Alert, CostSegment, InferenceModel, Instance, InstanceEvent, Offer, OfferProfile,
                              ProbeResult, ThroughputCalibration)
    from fleet.ranking import OfferFilters, Workload
    from runs.models import Checkpoint, DataSet, DataSetName, MetricPoint, Phase, Run, RunAttempt, RunEvent
    from tests.fleet.offer_records import offer_record
    from tests.runs.seeding import seed_run

    now = timezone.now()
    long_run = seed_run("qwen3-235b-a22b-five-phase-long-run", state="training", phases=(
        ("cpt", "cpt", 6000), ("sft", "sft", 6000), ("dpo", "dpo", 4000), ("kto", "kto", 2000),
        ("grpo", "grpo", 2000)), step_s=(0.5, 0.7))
    for i in range(30):
        RunEvent.objects.create(run=long_run, at=now - timedelta(minutes=i), kind="trainer_failed",
                                message=MESSAGE if i % 2 else UNBROKEN)
    # A CPU demo's prices (fractions of a cent per 1,000 steps) and gradient norms over several decades.
    MetricPoint.objects.filter(run=long_run, phase=0).update(grad_norm_routed=0.02)
    cheap = Instance.objects.filter(run_attempts__run=long_run)
    CostSegment.objects.filter(instance__in=cheap).update(usd_per_hour=Decimal("0.02"))
    cheap.update(usd_per_hour=Decimal("0.02"), gpu_name=GPU)
    Checkpoint.objects.create(run=long_run, phase=0, step=6000, uri="s3://bucket/" + "deep/" * 40 + "ckpt-p00",
                              complete=True, created_at=now)
    recovered = seed_run("recovered")
    Run.objects.create(name="recovered", recipe={}, bucket="s3://bucket/runs", budget_usd=5, token_nonce="n",
                       state="failed", created_at=now)  # the same name: told apart by its #id
    box = recovered.attempts.first().instance
    Instance.objects.filter(pk=box.pk).update(provider_status="running", gpu_util_percent=93.0, ended_at=now,
                                              running_at=now - timedelta(hours=2), destroy_reason=UNBROKEN)
    InstanceEvent.objects.create(instance=box, at=now, kind="destroyed", message=UNBROKEN)
    fresh = Run.objects.create(name="fresh", recipe={}, bucket="s3://bucket/" + "deep/" * 40, budget_usd=5,
                               token_nonce="n", state="pending", created_at=now)
    Phase.objects.create(run=fresh, index=0, name="sft", kind="sft", steps=100)
    named = seed_run("named", state="training", created_by=member)
    Run.objects.filter(pk=named.pk).update(name="x" * 100)  # a run name as long as the model allows
    Instance.objects.filter(run_attempts__run=named).update(gpu_name=GPU)
    named.refresh_from_db()

    live = Instance.objects.create(
        provider="runpod", provider_instance_id="p" * 40, idempotency_key="live", label=NAME_80, state="running",
        purpose="training", offer_id="NVIDIA RTX PRO 6000 Blackwell Server Edition:SECURE:1", gpu_name=GPU,
        num_gpus=8, image="ghcr.io/example/" + "moe-fleet-worker-image/" * 10 + "cuda:12.8", disk_gb=500,
        requested_at=now - timedelta(hours=3), running_at=now - timedelta(hours=3), usd_per_hour=Decimal("12.5"),
        status_msg=MESSAGE, is_bid=True, keep_until=now + timedelta(hours=2), public_ip="203.0.113.77",
        ports={"8000/tcp": "203.0.113.77:41234", "22/tcp": "203.0.113.77:41235"})
    CostSegment.objects.create(instance=live, usd_per_hour=live.usd_per_hour, started_at=live.running_at)
    RunAttempt.objects.create(run=named, instance=live, started_at=now - timedelta(hours=1),
                              end_reason=MESSAGE)
    for i in range(60):
        InstanceEvent.objects.create(instance=live, at=now - timedelta(minutes=i), kind="provider_status",
                                     message=MESSAGE if i % 2 else UNBROKEN)
    ended = Instance.objects.create(
        provider="vast", provider_instance_id="31" * 20, idempotency_key="ended", label="ended_" + "e" * 74,
        state="destroyed", purpose="manual", offer_id="1", gpu_name=GPU, num_gpus=2, image="img", disk_gb=80,
        requested_at=now - timedelta(hours=5), ended_at=now - timedelta(hours=1), destroy_reason=MESSAGE,
        usd_per_hour=Decimal("2"))

    record = offer_record("9" * 30, gpu_name=GPU, gpu_ram_gb=95.6, compute_capability=120,
                          geolocation="Quebec City, Quebec, Canada, CA")
    offer = Offer.objects.create(**Offer.field_values(record), first_seen_at=now, last_seen_at=now)
    best = {"offer_id": offer.offer_id, "num_gpus": 1, "gpu_name": GPU, "steps_per_usd": 1234.5,
            "total_usd": "123.45", "wall_hours": "12.3"}
    profile = OfferProfile.objects.create(
        name=PROFILE, recipe=Workload().to_dict(), filters=OfferFilters(gpu_tiers=()).to_dict(),
        last_ranked_at=now, last_ranking={"ranked": [best], "passed": 1})
    ThroughputCalibration.objects.create(gpu_model=GPU, kernel_path="triton", model_tflops=310.0, weight=3.0,
                                         measured_runs=3, note=MESSAGE[:200])

    dataset = DataSet.objects.create(
        name="tool_calls_" + "d" * 180 + ".jsonl", kind="sft", sha256="ab" * 32, size_bytes=123_456_789,
        rows=250_000, bucket="s3://bucket", uri="s3://team-bucket/" + "nested/" * 55 + "datasets/" + "ab" * 32 + "/",
        report={"tokenizer": "Qwen/Qwen3-30B-A3B", "sample": {"line": 1, "segments": [[UNBROKEN, False],
                                                                                       [MESSAGE, True]]}},
        uploaded_by=member, created_at=now)
    DataSetName.objects.create(dataset=dataset, user=member, name=dataset.name, stored_at=now)
    Phase.objects.filter(run=named).update(dataset=dataset, name="p" * 40)

    served = InferenceModel.objects.create(
        name="org_" + "m" * 190, image="vllm/vllm-openai:" + "v" * 100, base_model="Qwen/" + "b" * 200,
        adapter_uri="s3://bucket/" + "a" * 200, adapter_source=f"run {named.name} #{named.pk}, " + UNBROKEN[:150],
        vram_needed_gb=73.2, profile=profile, created_by=member)
    serving = Instance.objects.create(
        provider="vast", provider_instance_id="4" * 40, idempotency_key="serving", label="serving_" + "s" * 72,
        state="running", purpose="serving", offer_id="2", gpu_name=GPU, image="vllm", disk_gb=100,
        requested_at=now, running_at=now, serving_model=served, models_served=[served.name, "Qwen/" + "b" * 100],
        public_ip="203.0.113.78", last_probe_at=now, last_probe_latency_ms=45.0, consecutive_probe_failures=7)
    for i in range(5):
        ProbeResult.objects.create(instance=serving, at=now - timedelta(seconds=30 * i), ok=False,
                                   error=UNBROKEN[:300])

    endpoint = notify.create_endpoint(name="ops_" + "w" * 96, url="https://hooks.example.com/services/T0/B0/"
                                      + "k" * 60, events=[], slack=True)
    for i in range(3):
        notify.raise_alert(Alert.Kind.RUN_FAILED, MESSAGE if i else UNBROKEN, instance=live)
    notify.raise_alert(Alert.Kind.RUN_FAILED, UNBROKEN, instance=box)
    endpoint.deliveries.update(last_error=UNBROKEN[:500], state="retrying", attempts=3)

    finished = seed_run("finished")
    Run.objects.filter(pk=finished.pk).update(name="finished_" + "f" * 80, recipe={
        "model": {"path": "Qwen/Qwen3-30B-A3B"}, "lora": {"r": 4}})
    manifest = {f"vllm/{name}": {"size": 10, "sha256": "0" * 64}
                for name in ("adapter_config.json", "adapter_model.safetensors")}
    Checkpoint.objects.create(run=finished, phase=2, step=30, uri="s3://bucket/" + "deep/" * 40 + "final",
                              complete=True, manifest=manifest, created_at=now, sealed_at=now)
    return {"long": long_run, "recovered": recovered, "fresh": fresh, "named": named, "box": box, "live": live,
            "ended": ended, "offer": offer, "profile": profile, "dataset": dataset, "served": served,
            "finished": finished}


def operator_pages(rows) -> dict[str, str]:
    """Every page an operator reaches, by a name a failure message says."""
    return {
        "dashboard": "/", "offers": "/offers/", "offers with a profile": f"/offers/?profile={PROFILE}",
        "delete profile": f"/offers/profiles/{rows['profile'].pk}/delete/",
        "rent": f"/instances/rent/?provider=vast&offer={rows['offer'].offer_id}&bid=0",
        "instances": "/instances/", "live instance": f"/instances/{rows['live'].pk}/",
        "destroyed instance": f"/instances/{rows['box'].pk}/", "ended instance": f"/instances/{rows['ended'].pk}/",
        "destroy": f"/instances/{rows['live'].pk}/destroy/",
        "runs": "/runs/", "launch": "/runs/launch/", "long run": f"/runs/{rows['long'].pk}/",
        "recovered run": f"/runs/{rows['recovered'].pk}/", "run with no steps": f"/runs/{rows['fresh'].pk}/",
        "run with a long name": f"/runs/{rows['named'].pk}/", "finished run": f"/runs/{rows['finished'].pk}/",
        "cancel": f"/runs/{rows['long'].pk}/cancel/", "serve": f"/runs/{rows['finished'].pk}/serve/",
        "compare": "/runs/compare/", "data sets": "/datasets/", "data set": f"/datasets/{rows['dataset'].pk}/",
        "alerts": "/alerts/", "inference": "/inference/", "add inference model": "/inference/models/new/",
        "inference model": f"/inference/models/{rows['served'].pk}/", "not found": "/runs/999999/",
    }


def admin_pages(rows) -> dict[str, str]:
    """The admin's pages an operator reaches from the navigation's Admin link, with the same long words."""
    return {"admin": "/admin/", "admin instances": "/admin/fleet/instance/", "admin runs": "/admin/runs/run/",
            "admin instance": f"/admin/fleet/instance/{rows['live'].pk}/change/", "admin alerts": "/admin/fleet/alert/",
            "admin run": f"/admin/runs/run/{rows['named'].pk}/change/"}


def member_pages(rows) -> dict[str, str]:
    """Every page a plain user (no staff rights) reaches with their own run, box, data set and model."""
    return {
        "dashboard": "/", "offers": "/offers/", "instances": "/instances/",
        "live instance": f"/instances/{rows['live'].pk}/", "runs": "/runs/",
        "run with a long name": f"/runs/{rows['named'].pk}/", "compare": "/runs/compare/", "data sets": "/datasets/",
        "data set": f"/datasets/{rows['dataset'].pk}/", "alerts": "/alerts/", "inference": "/inference/",
        "not found": "/runs/999999/",
    }
