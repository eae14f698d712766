"""The embedded demo the whole way, through the pages: launch the tiny run on the example data, train it on the
simulated marketplace (the real agent and trainer as its boxes' processes), export, "Serve this adapter", a serving
box on the simulated marketplace that fetches and checks the adapter and starts (simulated) vLLM, and its probe green
with the adapter listed on its base."""

import hashlib
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from django.urls import reverse
from django.utils import timezone

import training
from fleet.models import InferenceModel, Instance, ProbeResult
from runs.models import Checkpoint, Phase, Run
from tests.marketplace import boxes_reporting_to, running_beat
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def market(tmp_path, settings, live_server):
    settings.PROBE_ALLOW_PRIVATE_ADDRESSES = True  # what the embedded default sets: its boxes are on 127.0.0.1
    settings.PROBE_TIMEOUT_S = 3
    # A loaded 2-core machine runs trainer, agent and server.
    with boxes_reporting_to(live_server.url, settings, tmp_path / "boxes", heartbeat_timeout_s=30,
                            loopback_boxes=True) as (sim, _):
        yield sim


@pytest.fixture
def beat(celery_worker, tmp_path):
    """Real Celery beat sending the product's own periodic tasks to the real worker twice a second."""
    tasks = ("fleet.tasks.sync_instances", "runs.tasks.supervise_runs", "fleet.tasks.maintain_inference_fleet",
             "fleet.tasks.probe_serving_instances")
    with running_beat(celery_worker, tmp_path, tasks) as service:
        yield service


def test_it_trains_the_tiny_run_and_serves_its_adapter_with_the_probe_green(client, operator, market, beat,
                                                                            tmp_path):
    client.force_login(operator)
    form = client.get(reverse("run_launch")).context["form"]
    launch = {name: form.initial[name] for name in ("name", "recipe", "budget_usd", "max_restarts")}
    recipe = yaml.safe_load(launch["recipe"])
    recipe["phases"][0]["min_step_seconds"] = 0  # the example's pace is for a person watching; this test is not one
    launch["recipe"] = yaml.safe_dump(recipe, sort_keys=False)
    answer = client.post(reverse("run_launch"), {**launch, "bucket": str(tmp_path / "bucket")})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    run = Run.objects.get()

    def finished():
        run.refresh_from_db()
        if not run.is_active:
            return True
        return False

    wait_until(finished, "the run to end", timeout_s=420, every_s=0.5)
    events = "\n".join(f"{e.kind}: {e.message[:200]}" for e in run.events.order_by("at", "id"))
    assert run.state == Run.State.FINISHED, events

    page = client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert "Serve this adapter" in page
    # Its eval phase scored the adapter and the base model on each record of example:eval.jsonl (noise on a tiny
    # random model: the mechanics are checked, not the scores).
    evaluation = run.evaluations.get()
    assert evaluation.state == "finished" and evaluation.samples.count() == evaluation.samples_expected == 5, events
    assert "Wins / ties / losses" in page and f"of {evaluation.samples_expected}</td>" in page
    assert "43 + 42 =" in page and "Name the capital of France." in page  # the per-sample table's prompts
    assert reverse("run_evaluation_csv", args=[run.pk]) in page
    serve = client.get(reverse("run_serve", args=[run.pk])).context["form"]
    choice = serve.fields["checkpoint"].choices[0]
    assert choice[1].startswith("grpo (phase 5)")  # the last phase's final adapter comes first
    data = {**{k: v for k, v in serve.initial.items() if v is not None}, "image": "vllm/vllm-openai:v0.11.2",
            "port": 8000, "desired_replicas": 1, "max_replacements_per_day": 3}
    assert client.post(reverse("run_serve", args=[run.pk]), data).status_code == 302
    model = InferenceModel.objects.get()

    def green():
        return ProbeResult.objects.filter(instance__serving_model=model, ok=True).first()

    probe = wait_until(green, "a green probe of the serving box", timeout_s=60, every_s=0.5)
    assert probe.models_served == [model.base_model, model.name]
    box = probe.instance  # the fleet may have replaced a box that failed to start on a loaded machine
    box.refresh_from_db()
    assert box.serving_model == model and box.public_ip == "127.0.0.1" and box.consecutive_probe_failures == 0
    fleet_page = client.get(reverse("inference")).content.decode()
    assert f"{model.base_model}, {model.name}" in fleet_page and f"adapter on {model.base_model}" in fleet_page


def _trained_run(tmp_path) -> Run:
    """The tiny example trained by the real trainer into a local store, recorded as the dashboard records a finished
    run: its last phase's final checkpoint complete with the manifest of every file it holds."""
    examples = Path(training.__file__).resolve().parent / "examples"
    recipe = yaml.safe_load((examples / "tiny.yaml").read_text())
    store = tmp_path / "bucket" / "runs" / "1"
    recipe["checkpoint"] = {"store": str(store), "staging": str(tmp_path / "staging"), "every": 2, "keep": 2}
    recipe["metrics"] = {"jsonl": str(tmp_path / "metrics.jsonl")}
    for phase in recipe["phases"]:
        phase["data"] = str(examples / phase["data"])
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    done = subprocess.run([sys.executable, "-m", "training.train", "--recipe", str(tmp_path / "recipe.yaml")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    last = recipe["phases"][-1]
    uri = f"ckpt-p{len(recipe['phases']) - 1:02d}-s{last['steps']:08d}"
    folder = store / uri
    manifest = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size,
                                                   "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                for p in folder.rglob("*") if p.is_file() and p.name != "COMPLETE"}
    now = timezone.now()
    run = Run.objects.create(pk=1, name="tiny-demo", recipe=recipe, bucket=str(tmp_path / "bucket"),
                             budget_usd=Decimal("5"), state=Run.State.FINISHED, token_nonce="n", created_at=now)
    for index, phase in enumerate(recipe["phases"]):
        Phase.objects.create(run=run, index=index, name=phase["kind"], kind=phase["kind"], steps=phase["steps"])
    # The trainer wrote it straight into the run's own folder, where the dashboard keeps a checkpoint it sealed.
    Checkpoint.objects.create(run=run, phase=len(recipe["phases"]) - 1, step=last["steps"], uri=uri, complete=True,
                              manifest=manifest, created_at=now, sealed_at=now)
    return run


def test_it_serves_a_trained_adapter_on_the_simulated_marketplace_with_the_probe_green(client, operator, market,
                                                                                        beat, tmp_path):
    run = _trained_run(tmp_path)
    client.force_login(operator)
    assert "Serve this adapter" in client.get(reverse("run_detail", args=[run.pk])).content.decode()
    serve = client.get(reverse("run_serve", args=[run.pk])).context["form"]
    assert serve.fields["checkpoint"].choices[0][1] == "grpo (phase 5), step 3"
    data = {**{k: v for k, v in serve.initial.items() if v is not None}, "image": "vllm/vllm-openai:v0.11.2",
            "port": 8000, "desired_replicas": 1, "max_replacements_per_day": 3}
    assert client.post(reverse("run_serve", args=[run.pk]), data).status_code == 302
    model = InferenceModel.objects.get()
    assert model.base_model == "random-qwen3_moe" and model.vram_needed_gb == 1.0

    def green():
        return ProbeResult.objects.filter(instance__serving_model=model, ok=True).first()

    probe = wait_until(green, "a green probe of the serving box", timeout_s=60, every_s=0.5)
    assert probe.models_served == [model.base_model, model.name]
    box = Instance.objects.get(serving_model=model)
    assert box.public_ip == "127.0.0.1" and box.consecutive_probe_failures == 0
    fetched = next((tmp_path / "boxes").glob(f"instance-*/work/adapters/{model.name}"))
    assert sorted(p.name for p in fetched.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    fleet_page = client.get(reverse("inference")).content.decode()
    assert f"{model.base_model}, {model.name}" in fleet_page and f"adapter on {model.base_model}" in fleet_page
