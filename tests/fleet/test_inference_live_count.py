"""An inference model's replicas are counted as a person reads them: live means a probe of its /v1/models passed
since the box started; a box that boots or was never probed is starting, not live."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import InferenceModel, Instance, ProbeResult

pytestmark = pytest.mark.django_db


def _box(model, key, state, **fields):
    now = timezone.now()
    return Instance.objects.create(provider="vast", idempotency_key=key, label=key, state=state, purpose="serving",
                                   offer_id="1", gpu_name="H200", image="vllm/vllm-openai:v0.9.2", disk_gb=100,
                                   requested_at=now - timedelta(minutes=5), serving_model=model, **fields)


def _replicas_cell(client, model) -> str:
    page = client.get("/inference/").content.decode()
    row = re.search(rf'<tr data-model="{model.pk}">(.*?)</tr>', page, re.S).group(1)
    cell = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[1]  # the Replicas column
    return re.sub(r"<[^>]+>", "", " ".join(cell.split()))


def test_a_never_probed_provisioning_box_is_starting_not_live(client, operator):
    client.force_login(operator)
    model = InferenceModel.objects.create(name="Qwen/Qwen3-30B-A3B", image="vllm/vllm-openai:v0.9.2", port=8000,
                                          desired_replicas=1, max_replacements_per_day=3)
    _box(model, "serve-1", Instance.State.PROVISIONING)
    assert _replicas_cell(client, model) == "0 live, 1 starting / 1 wanted"


def test_a_box_whose_probe_passed_is_live(client, operator):
    client.force_login(operator)
    model = InferenceModel.objects.create(name="Qwen/Qwen3-30B-A3B", image="vllm/vllm-openai:v0.9.2", port=8000,
                                          desired_replicas=2, max_replacements_per_day=3)
    now = timezone.now()
    probed = _box(model, "serve-1", Instance.State.RUNNING, last_probe_at=now)
    ProbeResult.objects.create(instance=probed, at=now, ok=True, latency_ms=12.0)
    failing = _box(model, "serve-2", Instance.State.RUNNING, last_probe_at=now, consecutive_probe_failures=1)
    ProbeResult.objects.create(instance=failing, at=now, ok=False, error="connection refused")
    assert _replicas_cell(client, model) == "1 live, 1 starting / 2 wanted"


def test_the_models_page_counts_its_replicas_the_same_way(client, operator):
    client.force_login(operator)
    model = InferenceModel.objects.create(name="Qwen/Qwen3-30B-A3B", image="vllm/vllm-openai:v0.9.2", port=8000,
                                          desired_replicas=1, max_replacements_per_day=3)
    _box(model, "serve-1", Instance.State.PROVISIONING)
    page = client.get(f"/inference/models/{model.pk}/").content.decode()
    said = re.search(r'<p class="meta" id="model-replicas">(.*?)</p>', page, re.S)
    assert said and said.group(1).startswith("Replicas now: 0 live, 1 starting / 1 wanted")
