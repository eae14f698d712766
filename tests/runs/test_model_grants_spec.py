"""An s3:// base model through the agent API's own answer (moto's server, on loopback): /spec carries the model's grant,
listed and signed once per attempt (again for a new attempt or an old grant), a prefix the dashboard cannot list,
an emptied one or one past MAX_MODEL_OBJECTS is refused with its reason, and the agent reports that and stops."""

import json
from datetime import datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from runs import storage
from runs.launch import launch
from runs.models import ModelGrant
from tests.runs.conftest import put_on_a_box, tiny_recipe
from training import model_source
from training.agent import run as agent_run
from training.agent.dashboard import Api, Refused
from training.agent.exit_codes import Exit
from training.agent.heartbeat import Heartbeat

from .test_model_grants_s3 import FILES, MODEL, _put_model, emptied_afterwards  # noqa: F401
from .test_storage_s3 import BUCKET, s3  # noqa: F401

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"


def _run(tmp_path):
    return launch(name="s3-model", recipe=tiny_recipe(model={"path": MODEL, "dtype": "float32"}),
                  bucket=str(tmp_path / "bucket"), budget_usd=5, max_restarts=2)


def _spec(token) -> dict:
    response = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get(API + "/spec")
    assert response.status_code == 200, response.content[:500]
    return response.json()


@pytest.fixture
def listings(s3):  # noqa: F811
    """How often the dashboard's S3 client lists a bucket (each page of ListObjectsV2 is one call)."""
    calls = []
    events = storage.s3_client().meta.events
    handler_id = "count-listings"
    events.register("provide-client-params.s3.ListObjectsV2", lambda **kwargs: calls.append(kwargs["params"]),
                    unique_id=handler_id)
    yield calls
    events.unregister("provide-client-params.s3.ListObjectsV2", unique_id=handler_id)


def test_the_spec_grants_each_file_of_an_s3_model_and_the_box_downloads_through_it(s3, tmp_path):  # noqa: F811
    _put_model(s3)
    run = _run(tmp_path)
    model = _spec(put_on_a_box(run))["model"]
    assert model["kind"] == "s3" and model["uri"] == MODEL
    assert model["files"] == {name: len(data) for name, data in FILES.items()}
    assert set(model["download"]["files"]) == set(FILES) and "account-secret" not in json.dumps(model)
    left = datetime.fromisoformat(model["expires_at"]) - timezone.now()
    assert timedelta(minutes=59) < left <= timedelta(hours=1)  # STORAGE_GRANT_S
    folder = model_source.fetch(model, tmp_path / "box")
    assert {name: (folder / name).read_bytes() for name in FILES} == FILES


def test_the_openapi_schema_describes_the_models_grant(launched):
    schema = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(launched())}").get(API + "/openapi.json").json()
    spec = schema["components"]["schemas"]["SpecOut"]["properties"]["model"]
    kinds = {ref["$ref"].rsplit("/", 1)[-1] for ref in spec["anyOf"][0]["oneOf"]}
    assert kinds == {"HubModelOut", "S3ModelOut", "RefusedModelOut"}
    assert {"files", "download", "expires_at"} <= set(schema["components"]["schemas"]["S3ModelOut"]["required"])


def test_a_hub_model_is_named_in_the_spec_without_any_listing(tmp_path, listings):
    run = launch(name="hub", recipe=tiny_recipe(model={"path": "Qwen/Qwen3-30B-A3B", "revision": "main"}),
                 bucket=str(tmp_path / "bucket"), budget_usd=5, max_restarts=1)
    assert _spec(put_on_a_box(run))["model"] == {"kind": "hub", "repo_id": "Qwen/Qwen3-30B-A3B", "revision": "main"}
    assert listings == [] and not ModelGrant.objects.exists()


def test_it_lists_and_signs_once_per_attempt_and_again_for_a_new_attempt_or_an_old_grant(
        s3, tmp_path, listings):  # noqa: F811
    _put_model(s3)
    run = _run(tmp_path)
    listings.clear()  # the launch's own sizing of the model
    token = put_on_a_box(run)
    first = _spec(token)["model"]
    assert len(listings) == 1 and listings[0]["Prefix"] == "models/qwen3-tiny/"
    for _ in range(5):  # a box asking again, or in a loop: the same grant, the bucket not listed again
        assert _spec(token)["model"] == first
    assert len(listings) == 1

    second_box = put_on_a_box(run)
    again = _spec(second_box)["model"]
    assert len(listings) == 2 and again["files"] == first["files"]
    assert ModelGrant.objects.get().attempt == run.attempts.last()  # the replaced box's grant is gone
    assert _spec(second_box)["model"] == again and len(listings) == 2

    # Less than half its life left: signed anew, so a box is never handed GETs about to expire.
    ModelGrant.objects.update(expires_at=timezone.now() + timedelta(minutes=29))
    renewed = _spec(second_box)["model"]
    assert len(listings) == 3
    assert datetime.fromisoformat(renewed["expires_at"]) > datetime.fromisoformat(again["expires_at"])


class ThroughTheApi(Api):
    """The agent's API client, answered by the dashboard's real agent API in this process (Django's test client)."""

    def __init__(self, token):
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def call(self, method, path, body=None):
        if method == "GET":
            response = self.client.get(f"{API}/{path}")
        else:
            response = self.client.post(f"{API}/{path}", json.dumps(body), content_type="application/json")
        if response.status_code >= 400:
            raise Refused(f"{method} {path}: HTTP {response.status_code}", response.status_code)
        return response.json()


@pytest.mark.parametrize("change, reason", [
    ("emptied", f"{MODEL} holds no files"),
    ("bucket gone", "s3://gone-soon/models/qwen3-tiny cannot be listed with the dashboard's key: NoSuchBucket"),
    ("too many", f"{MODEL} holds more than 3 objects, more than any model's folder"),
])
def test_a_model_it_can_no_longer_list_is_refused_and_the_box_says_why_and_stops(
        s3, tmp_path, monkeypatch, listings, change, reason):  # noqa: F811
    _put_model(s3)
    run = _run(tmp_path)
    if change == "emptied":
        for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="models/qwen3-tiny/")["Contents"]:
            s3.delete_object(Bucket=BUCKET, Key=item["Key"])
    elif change == "bucket gone":  # launched while its bucket was there
        s3.create_bucket(Bucket="gone-soon")
        s3.put_object(Bucket="gone-soon", Key="models/qwen3-tiny/config.json", Body=FILES["config.json"])
        run = launch(name="gone", recipe=tiny_recipe(model={"path": "s3://gone-soon/models/qwen3-tiny"}),
                     bucket=str(tmp_path / "bucket"), budget_usd=5, max_restarts=2)
        s3.delete_object(Bucket="gone-soon", Key="models/qwen3-tiny/config.json")
        s3.delete_bucket(Bucket="gone-soon")
    else:
        monkeypatch.setattr(storage, "MAX_MODEL_OBJECTS", 3)  # the model's 3 files and one more
        s3.put_object(Bucket=BUCKET, Key="models/qwen3-tiny/extra.bin", Body=b"x")
    token = put_on_a_box(run)
    listings.clear()
    model = _spec(token)["model"]
    assert model["kind"] == "refused" and reason in model["reason"]

    started = []
    monkeypatch.setattr(agent_run, "probe", lambda python: (True, "probe ok"))
    monkeypatch.setattr(agent_run.subprocess, "Popen", lambda *a, **k: started.append(a))
    api = ThroughTheApi(token)
    assert agent_run.run(api, Heartbeat(api, 60, 3600), tmp_path / "work", "python") == Exit.MODEL_REFUSED
    assert started == [] and not (tmp_path / "work" / "recipe.json").exists()
    run.refresh_from_db()
    assert run.state == "failed" and reason in run.state_reason
    assert "Nothing was trained: the dashboard could not grant the model" in run.state_reason
    assert len(listings) == 1  # the refusal too is said from what the first ask found


class _Stop(Exception):
    pass


def test_a_store_that_does_not_answer_is_a_503_the_box_rides_out_and_the_run_goes_on(
        s3, tmp_path, monkeypatch, live_server):  # noqa: F811
    import botocore.exceptions

    from training.agent import dashboard

    _put_model(s3)
    run = _run(tmp_path)
    token = put_on_a_box(run)
    real, outage = storage._objects, {"left": 6}  # longer than one call's own tries ride out

    def flaky(*args, **kwargs):
        if outage["left"]:
            outage["left"] -= 1
            raise botocore.exceptions.EndpointConnectionError(endpoint_url="http://store.invalid")
        return real(*args, **kwargs)

    monkeypatch.setattr(storage, "_objects", flaky)
    response = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get(API + "/spec")
    assert response.status_code == 503 and int(response["Retry-After"]) > 0
    assert "did not answer" in response.json()["detail"]
    run.refresh_from_db()
    assert run.is_active and not ModelGrant.objects.exists()  # nothing refused, nothing kept of the outage

    granted = []

    def fetched(api, grant, model, folder, volume=None):
        granted.append(grant)
        raise _Stop

    monkeypatch.setattr(dashboard, "FIRST_WAIT_S", 0.01)
    monkeypatch.setattr(dashboard, "MAX_WAIT_S", 0.01)
    monkeypatch.setattr(agent_run, "SPEC_FIRST_WAIT_S", 0.01)
    monkeypatch.setattr(agent_run, "SPEC_MAX_WAIT_S", 0.01)
    monkeypatch.setattr(agent_run, "probe", lambda python: (True, "probe ok"))
    monkeypatch.setattr(agent_run, "fetch_model", fetched)
    api = Api(live_server.url + API, token)
    with pytest.raises(_Stop):
        agent_run.run(api, Heartbeat(api, 60, 3600), tmp_path / "work", "python")
    assert outage["left"] == 0 and granted[0]["kind"] == "s3" and set(granted[0]["files"]) == set(FILES)
    run.refresh_from_db()
    assert run.is_active
