"""Serving a finished run's adapter: the run page's button and form make the inference model; its box reads the
adapter's vllm/ files through an expiring grant for those files only, checks them against the checkpoint's manifest
before vLLM starts, and counts as healthy only while /v1/models lists the adapter on its base (the simulated vLLM
answering as vLLM does)."""

import hashlib
import json
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import boto3
import httpx
import pytest
from moto.server import ThreadedMotoServer
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from fleet.inference import adapters, probes, replicas
from fleet.models import InferenceModel, Instance, ProbeResult
from fleet.providers import vast
from fleet.providers.records import RentRequest
from fleet.simulator.agents import AgentProcesses
from runs import serving
from runs.models import Checkpoint, Phase, Run

pytestmark = pytest.mark.django_db
BASE = "Qwen/Qwen3-30B-A3B"
ADAPTER = "tool-calls-7-sft"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vllm_export(folder: Path, rank=4) -> dict:
    """A checkpoint's vllm/ folder as training.export_adapter writes it; its manifest entries as a box declares."""
    vllm = folder / "vllm"
    vllm.mkdir(parents=True)
    (vllm / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 2 * rank, "peft_type": "LORA"}))
    (vllm / "adapter_model.safetensors").write_bytes(b"tensors" * 1000)
    return {f"vllm/{p.name}": {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
            for p in vllm.iterdir()}


def _finished_run(tmp_path, *, export=True, state=Run.State.FINISHED, model=None, rank=4) -> Run:
    now = timezone.now()
    run = Run.objects.create(name="tool calls", recipe={"model": model or {"path": BASE}, "lora": {"r": rank}},
                             bucket=str(tmp_path / "bucket"), budget_usd=Decimal("5"), state=state, token_nonce="n",
                             created_at=now)
    Phase.objects.create(run=run, index=0, name="sft", kind="sft", steps=4)
    uri = "ckpt-p00-s00000004"
    folder = Path(serving.storage.location(run.bucket, run.pk).bucket) / f"runs/{run.pk}" / uri
    manifest = {"adapter/adapter_model.safetensors": {"size": 1, "sha256": "0" * 64}}
    if export:
        manifest |= _vllm_export(folder)
    Checkpoint.objects.create(run=run, phase=0, step=2, uri="ckpt-p00-s00000002", complete=True, manifest=manifest,
                              created_at=now, sealed_at=now)
    Checkpoint.objects.create(run=run, phase=0, step=4, uri=uri, complete=True, manifest=manifest, created_at=now,
                              sealed_at=now)
    return run


def _model(tmp_path, **fields) -> InferenceModel:
    manifest = {name.removeprefix("vllm/"): entry for name, entry in _vllm_export(tmp_path / "store").items()}
    return InferenceModel.objects.create(**{
        "name": ADAPTER, "base_model": BASE, "image": "vllm/vllm-openai:v0.11.2", "port": 8000,
        "adapter_uri": str(tmp_path / "store" / "vllm"), "adapter_manifest": manifest, "vram_needed_gb": 73.2,
        **fields})


def _box_answers(port: int, timeout_s=30) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).json()
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"nothing answered on port {port}")


def _row(model) -> Instance:
    """The serving box's row as the fleet writes it before the rent (its check-in token is bound to it)."""
    return Instance.objects.create(provider="vast", idempotency_key=f"serve-{Instance.objects.count()}",
                                   label="serve-1", purpose="serving", offer_id="1", gpu_name="H100 SXM",
                                   image=model.image, disk_gb=100, requested_at=timezone.now(), serving_model=model)


def _start_box(model, tmp_path, port, gpus=1) -> AgentProcesses:
    """The box as the simulated marketplace runs it: the start script and environment the fleet rents it with."""
    boxes = AgentProcesses(tmp_path / "boxes")
    env = replicas.serving_env(model, _row(model))
    boxes.on_running({"id": 1, "onstart": replicas.serving_onstart(model), "env": env,
                      "num_gpus": gpus, "ports": {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]}})
    return boxes


def test_it_fetches_the_adapter_checks_it_and_serves_it_as_vllm_lists_it(tmp_path):
    model, port = _model(tmp_path), _free_port()
    boxes = _start_box(model, tmp_path, port)
    try:
        listing = _box_answers(port)
    finally:
        boxes.stop_all()
    base, adapter = listing["data"]
    assert listing["object"] == "list"
    assert (base["id"], base["parent"], base["object"], base["owned_by"]) == (BASE, None, "model", "vllm")
    assert (adapter["id"], adapter["parent"]) == (ADAPTER, BASE)
    fetched = Path(adapter["root"])  # the box's own copy, not the store's folder
    assert fetched.is_relative_to(tmp_path / "boxes") and sorted(p.name for p in fetched.iterdir()) == \
        ["adapter_config.json", "adapter_model.safetensors"]
    assert (fetched / "adapter_model.safetensors").read_bytes() == \
        (tmp_path / "store" / "vllm" / "adapter_model.safetensors").read_bytes()
    assert adapters.listing_problem(json.dumps(listing).encode(), ADAPTER, BASE) == ""


@pytest.mark.parametrize("gpus, parallel", [(1, 1), (3, 2), (8, 8)])
def test_it_serves_over_the_boxs_gpus(tmp_path, gpus, parallel):
    # A model ranked onto several GPUs because one card cannot hold it loads only split over them (and vLLM wants a
    # size that divides the heads: the largest power of two of them).
    model, port = _model(tmp_path), _free_port()
    boxes = _start_box(model, tmp_path, port, gpus=gpus)
    try:
        assert [m["id"] for m in _box_answers(port)["data"]] == [BASE, ADAPTER]
    finally:
        boxes.stop_all()
    log = (boxes.folder(1) / "work" / "vllm.log").read_text()
    assert f"tensor-parallel over {parallel} GPU(s)" in log


def test_it_never_starts_vllm_on_an_adapter_file_that_does_not_match_its_manifest(tmp_path):
    model, port = _model(tmp_path), _free_port()
    (tmp_path / "store" / "vllm" / "adapter_model.safetensors").write_bytes(b"planted" * 1000)  # after it was recorded
    boxes = _start_box(model, tmp_path, port)
    process = boxes.processes[1]
    try:
        process.wait(timeout=30)
        time.sleep(0.5)
        log = boxes.logs(1)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
    finally:
        boxes.stop_all()
    assert process.returncode != 0
    assert "adapter: FAILED: ValueError: adapter_model.safetensors is 7000 bytes with sha256" in log
    assert "INFO: serving" not in log
    assert not (tmp_path / "boxes" / "instance-1" / "work" / "adapters" / ADAPTER).exists()


def test_it_refuses_an_adapter_file_larger_than_its_manifest_says_before_filling_the_disk(tmp_path):
    model, port = _model(tmp_path), _free_port()
    # Planted after it was recorded: far more bytes than the manifest's 7000, which the box must not write out whole.
    (tmp_path / "store" / "vllm" / "adapter_model.safetensors").write_bytes(b"x" * (8 << 20))
    boxes = _start_box(model, tmp_path, port)
    process = boxes.processes[1]
    try:
        process.wait(timeout=30)
        log = boxes.logs(1)
    finally:
        boxes.stop_all()
    assert process.returncode != 0
    assert "adapter: FAILED: ValueError: adapter_model.safetensors is larger than its manifest says" in log
    assert "INFO: serving" not in log


def test_it_offers_no_adapter_larger_than_any_vllm_export(tmp_path):
    run = _finished_run(tmp_path)
    assert [a.checkpoint.step for a in serving.servable(run)] == [4]
    row = run.checkpoints.get(step=4)
    row.manifest["vllm/adapter_model.safetensors"]["size"] = adapters.MAX_ADAPTER_BYTES
    row.save()
    assert serving.servable(run) == []


def _serve(*args, port) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fleet.simulator.vllm", "serve", BASE, "--port", str(port), *args])


def test_it_counts_a_box_that_serves_the_base_without_the_adapter_as_failing(tmp_path, settings):
    settings.PROBE_ALLOW_PRIVATE_ADDRESSES, settings.PROBE_TIMEOUT_S = True, 2
    model = _model(tmp_path)
    folder = tmp_path / "store" / "vllm"
    servers = {"with": (_free_port(), ["--enable-lora", "--lora-modules", f"{ADAPTER}={folder}"]),
               "without": (_free_port(), []),
               "other base": (_free_port(), ["--enable-lora", "--lora-modules",
                                             json.dumps({"name": ADAPTER, "path": str(folder),
                                                         "base_model_name": "other/base"})])}
    processes = [_serve(*args, port=port) for port, args in servers.values()]
    now = timezone.now()
    try:
        for port, _ in servers.values():
            _box_answers(port)
        boxes = {key: Instance.objects.create(
            provider="vast", idempotency_key=key, label=key, state=Instance.State.RUNNING, purpose="serving",
            offer_id="1", gpu_name="H100 SXM", image=model.image, disk_gb=100, requested_at=now, running_at=now,
            public_ip="127.0.0.1", ports={"8000/tcp": port}, serving_model=model) for key, (port, _) in servers.items()}
        report = probes.probe_serving_instances()
    finally:
        for process in processes:
            process.kill()
            process.wait()
    results = {key: ProbeResult.objects.get(instance=box) for key, box in boxes.items()}
    assert report.ok == 1 and results["with"].ok and results["with"].models_served == [BASE, ADAPTER]
    assert not results["without"].ok
    assert results["without"].error.endswith(f"serves {BASE} but not the adapter {ADAPTER}")
    assert not results["other base"].ok
    assert results["other base"].error.endswith(f"lists the adapter {ADAPTER} on other/base, not on {BASE}")


def test_it_ranks_a_serving_box_by_the_vram_its_model_needs(tmp_path):
    recipe, _ = replicas.rank_settings(_model(tmp_path, vram_needed_gb=150))
    assert recipe.vram_gb == 150 and recipe.model == BASE


def test_it_shows_serve_on_a_finished_run_to_staff_who_may_add_inference_models(client, staff, tmp_path,
                                                                                 django_user_model):
    run, unfinished = _finished_run(tmp_path), _finished_run(tmp_path, state=Run.State.TRAINING)
    client.force_login(staff)
    assert "Serve this adapter" in client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert "Serve this adapter" not in client.get(reverse("run_detail", args=[unfinished.pk])).content.decode()
    other = django_user_model.objects.create_user("viewer", password="viewer-pass-123", is_staff=True)
    other.user_permissions.add(Permission.objects.get(codename="change_inferencemodel"))
    client.force_login(other)
    assert "Serve this adapter" not in client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert client.get(reverse("run_serve", args=[run.pk])).status_code == 403
    assert client.post(reverse("run_serve", args=[run.pk]), {"name": "x"}).status_code == 403
    assert not InferenceModel.objects.exists()


def test_it_serves_the_adapter_the_form_names_with_the_replicas_asked_for(client, staff, tmp_path):
    run = _finished_run(tmp_path)
    client.force_login(staff)
    page = client.get(reverse("run_serve", args=[run.pk]))
    assert page.status_code == 200
    form = page.context["form"]
    assert form.initial["base_model"] == BASE and form.initial["vram_needed_gb"] == 73.2
    assert form.fields["checkpoint"].choices == [(run.checkpoints.get(step=4).pk, "sft (phase 1), step 4")]
    data = {**{k: v for k, v in form.initial.items() if v is not None}, "image": "vllm/vllm-openai:v0.11.2",
            "port": 8000, "desired_replicas": 2, "max_replacements_per_day": 4}
    bad = client.post(reverse("run_serve", args=[run.pk]), {**data, "name": "has spaces"})
    assert bad.status_code == 400 and "no spaces" in bad.content.decode()
    done = client.post(reverse("run_serve", args=[run.pk]), data)
    assert done.status_code == 302 and done.url == reverse("inference")
    model = InferenceModel.objects.get()
    folder = Path(run.bucket) / f"runs/{run.pk}" / "ckpt-p00-s00000004" / "vllm"
    assert (model.name, model.base_model, model.desired_replicas) == (f"tool-calls-{run.pk}-sft", BASE, 2)
    assert model.adapter_uri == str(folder)
    assert model.adapter_manifest == {p.name: {"size": p.stat().st_size,
                                               "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                                      for p in folder.iterdir()}
    page = client.get(reverse("inference")).content.decode()
    assert f"adapter on {BASE}, from run tool calls #{run.pk}, sft (phase 1), step 4" in page


def _serve_data(client, run, **changes) -> dict:
    form = client.get(reverse("run_serve", args=[run.pk])).context["form"]
    return {**{k: v for k, v in form.initial.items() if v is not None}, "image": form.fields["image"].initial,
            "port": 8000, "desired_replicas": 1, "max_replacements_per_day": 3, **changes}


def test_it_serves_the_adapter_on_the_base_revision_it_was_trained_on(client, staff, tmp_path):
    run = _finished_run(tmp_path, model={"path": BASE, "revision": "a1b2c3d"})
    client.force_login(staff)
    data = _serve_data(client, run)
    assert data["base_revision"] == "a1b2c3d" and data["image"] == "vllm/vllm-openai:v0.26.0"
    assert client.post(reverse("run_serve", args=[run.pk]), data).status_code == 302
    model = InferenceModel.objects.get()
    assert model.base_revision == "a1b2c3d"
    assert f"vllm serve {BASE} --revision a1b2c3d --host" in replicas.serving_onstart(model)
    bad = client.post(reverse("run_serve", args=[run.pk]), {**data, "name": "other", "base_revision": "x; rm -rf /"})
    assert bad.status_code == 400 and "A revision is a branch, tag or commit" in bad.content.decode()


@pytest.mark.parametrize("base, image, words", [
    (BASE, "vllm/vllm-openai:v0.26.0", "vLLM v0.26.0 has served Qwen3-MoE adapters as peft answers them."),
    ("Qwen/Qwen3.6-35B-A3B", "vllm/vllm-openai:v0.34.0",
     "No vLLM release has yet served Qwen3.5/3.6-MoE adapters as peft answers them"),
])
def test_the_form_starts_with_the_release_checked_for_the_bases_family_or_says_none_is(client, staff, tmp_path, base,
                                                                                        image, words):
    run = _finished_run(tmp_path, model={"path": base})
    client.force_login(staff)
    page = client.get(reverse("run_serve", args=[run.pk]))
    assert page.context["form"].fields["image"].initial == image and f'value="{image}"' in page.content.decode()
    assert words in page.content.decode()


@pytest.mark.parametrize("image, base, refused", [
    ("vllm/vllm-openai:v0.11.2", "Qwen/Qwen3.6-35B-A3B", "cannot serve a Qwen3.5/3.6-MoE adapter"),
    ("vllm/vllm-openai:v0.24.1", "Qwen/Qwen3.5-122B-A10B", "cannot serve a Qwen3.5/3.6-MoE adapter"),
    ("vllm/vllm-openai:v0.10.1", BASE, "loads no LoRA on MoE experts"),
    ("vllm/vllm-openai:v0.11.2", BASE, ""),
    ("vllm/vllm-openai:v0.34.0", "Qwen/Qwen3.6-35B-A3B", ""),
    ("registry.example/ours/vllm@sha256:" + "a" * 64, "Qwen/Qwen3.6-35B-A3B", ""),  # not a release tag: the user's
])
def test_it_refuses_a_vllm_release_that_cannot_serve_the_base(client, staff, tmp_path, image, base, refused):
    run = _finished_run(tmp_path)
    client.force_login(staff)
    answer = client.post(reverse("run_serve", args=[run.pk]), _serve_data(client, run, image=image, base_model=base))
    if refused:
        assert answer.status_code == 400 and refused in answer.content.decode()
        assert not InferenceModel.objects.exists()
    else:
        assert answer.status_code == 302


def test_it_says_why_a_rank_vllm_refuses_cannot_be_served(client, staff, tmp_path):
    run = _finished_run(tmp_path, rank=1024)
    client.force_login(staff)
    answer = client.get(reverse("run_serve", args=[run.pk]), follow=True)
    assert "trained LoRA rank 1024: vLLM serves ranks up to 512" in answer.content.decode()
    assert serving.servable(run) == []


def test_it_says_why_a_run_without_a_vllm_export_cannot_be_served(client, staff, tmp_path):
    run = _finished_run(tmp_path, export=False)
    client.force_login(staff)
    answer = client.get(reverse("run_serve", args=[run.pk]), follow=True)
    assert "no phase&#x27;s final checkpoint holds vllm/" in answer.content.decode()
    assert not InferenceModel.objects.exists()


def test_it_grants_a_serving_box_the_adapters_files_only_and_for_a_while(settings, tmp_path):
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        settings.S3_ENDPOINT_URL = f"http://127.0.0.1:{port}"
        settings.S3_REGION, settings.S3_ACCESS_KEY = "us-east-1", "account-key"
        settings.S3_SECRET_KEY = "account-secret"
        s3 = boto3.client("s3", endpoint_url=settings.S3_ENDPOINT_URL, region_name="us-east-1",
                          aws_access_key_id="account-key", aws_secret_access_key="account-secret")
        s3.create_bucket(Bucket="store")
        model = _model(tmp_path, adapter_uri="s3://store/team/runs/3/ckpt-p00-s00000004/vllm")
        for name in ("vllm/adapter_config.json", "vllm/adapter_model.safetensors",
                     "adapter/adapter_model.safetensors", "trainer.pt"):
            s3.put_object(Bucket="store", Key=f"team/runs/3/ckpt-p00-s00000004/{name}", Body=name.encode())
        settings.STORAGE_GRANT_S = 600
        env = replicas.serving_env(model, _row(model))
        parts = int(env[f"{adapters.ENV}_PARTS"])
        grant = json.loads("".join(env[f"{adapters.ENV}_{i}"] for i in range(parts)))["grant"]
        assert "account-secret" not in json.dumps(env)
        # Presigned URLs run to thousands of characters; vast.ai takes 256 a variable and 4,096 of start script.
        assert parts > 4 and not vast.rent_request_problem(RentRequest(
            offer_id="1", image=model.image, disk_gb=100, label="serve-1", env=env,
            onstart=replicas.serving_onstart(model)))
        assert grant["kind"] == "s3-get" and sorted(grant["files"]) == ["adapter_config.json",
                                                                          "adapter_model.safetensors"]
        for name, url in grant["files"].items():
            assert "X-Amz-Expires=600" in url
            assert httpx.get(url).content == f"vllm/{name}".encode()
        # Made when the box is rented, not when the model was: a replacement rented tomorrow gets its own.
        signed_at = datetime.strptime(parse_qs(urlparse(url).query)["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ")
        assert abs(signed_at.replace(tzinfo=UTC) - datetime.now(UTC)) < timedelta(minutes=1)
    finally:
        server.stop()


def test_the_longest_start_script_fits_vasts_limit(tmp_path):
    model = _model(tmp_path, name="a" * 100, base_model="b" * 64 + "/" + "c" * 96, base_revision="f" * 40)
    assert len(replicas.serving_onstart(model)) <= vast.START_MAX
