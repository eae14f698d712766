"""A run that names a volume (the simulated vast.ai's, an s3:// model on moto's S3): the launch checks the volume at the
provider, its boxes are rented only on the volume's machine and mount it, and once a box said the model there matches
the dashboard's manifest, the ranking prices its start-up without the model download."""

import json

import httpx
import pytest
from django.test import Client
from django.utils import timezone

from fleet import volumes
from fleet.offers.ranked import rank_stored_offers
from fleet.offers.refresh import refresh_offers
from runs import model_manifests, supervisor
from runs.box_request import BoxRequest
from runs.launch import LaunchError, launch
from runs.models import Run
from tests.marketplace import MARKET_KEY
from tests.runs.conftest import tiny_recipe

from .test_model_grants_s3 import MODEL, _put_model
from .test_storage_s3 import BUCKET, s3  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def emptied_afterwards(s3):  # noqa: F811 - moto keeps one store per process, across its servers
    yield
    for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        s3.delete_object(Bucket=BUCKET, Key=item["Key"])


def _volume_on(market, offer_id: str, size_gb: int) -> str:
    """A volume of the account on the offer's machine, made as `vastai create volume` makes it."""
    made = httpx.put(f"{market.base_url}/volumes/", json={"id": int(offer_id), "size": size_gb, "name": "weights"},
                     headers={"Authorization": f"Bearer {MARKET_KEY}"}).json()
    return made["volume_name"].removeprefix("V.")


def _launch(tmp_path, volume, **recipe):
    return launch(name="on-volume", recipe=tiny_recipe(model={"path": MODEL}, **recipe), bucket=str(tmp_path / "b"),
                  budget_usd=50, max_restarts=2, volume=volume)


def test_a_run_rents_only_where_its_volume_mounts_and_prices_the_model_it_holds(s3, frozen_market,  # noqa: F811
                                                                                tmp_path):
    _put_model(s3)
    refresh_offers()
    probe = _launch(tmp_path, None)
    ranked = [e.offer for e in rank_stored_offers(*_request(probe)).entries]
    third = ranked[2]  # not the best: only its volume puts the run there
    volume_id = _volume_on(frozen_market, third.offer_id, 100)

    run = _launch(tmp_path, {"provider": "vast", "id": volume_id, "mount_path": "/workspace/models"})
    assert (run.volume["id"], run.volume["machine_id"], run.volume["mount_path"]) == (
        volume_id, third.machine_id, "/workspace/models")
    said = run.events.get(kind="volume").message
    assert f"vast.ai machine {third.machine_id} only" in said and "matches the size and sha256" in said
    assert model_manifests.record(MODEL)  # the launch queued it; the test's worker is this call

    before = BoxRequest.for_run(run)
    assert before.volume == run.volume and before.figures.model_download_gb > 0  # no box has said so yet
    supervisor.supervise(now=timezone.now())
    run.refresh_from_db()
    box = run.current_instance
    assert box.machine_id == third.machine_id and box.volume["id"] == volume_id
    (listed,) = [i for i in frozen_market.state()["instances"] if i["label"] == box.label]
    assert listed["volume_info"][0]["mount_path"] == "/workspace/models"

    # The box found the model matching the manifest (training/agent/inputs.py says so as this event).
    env = listed["env"]
    agent = Client(HTTP_AUTHORIZATION=f"Bearer {env['FLEET_AGENT_TOKEN']}")
    spec = agent.get("/api/agent/v1/spec").json()
    assert spec["model_volume"] == {"mount_path": "/workspace/models"}
    assert set(spec["model"]["manifest"]) == set(spec["model"]["files"])
    posted = agent.post("/api/agent/v1/events", json.dumps({"kind": "model_on_volume", "message": "matches"}),
                        content_type="application/json")
    assert posted.status_code == 200
    after = BoxRequest.for_run(run)
    assert after.figures.model_download_gb == 0.0
    entry = rank_stored_offers(after.figures, after.filters).entries[0]
    assert entry.cost.download_usd == 0


def test_a_launch_refuses_a_volume_it_cannot_use_by_its_field(s3, frozen_market, tmp_path):  # noqa: F811
    _put_model(s3)
    refresh_offers()
    offer = rank_stored_offers(*_request(_launch(tmp_path, None))).entries[0].offer
    small = _volume_on(frozen_market, offer.offer_id, 20)
    cases = [({"provider": "vast", "id": "999"}, "volume_id", "has no volume 999"),
             ({"provider": "vast", "id": small}, "volume_id", "has 20 GB, and the model needs"),
             ({"provider": "runpod", "id": "x"}, "volume_provider", "no key for it"),
             ({"provider": "vast", "id": small, "mount_path": "/etc"}, "volume_mount_path", "would hide")]
    for volume, field, words in cases:
        with pytest.raises(LaunchError, match=words) as refused:
            _launch(tmp_path, volume)
        assert refused.value.field == field
    with pytest.raises(LaunchError, match="no download for a volume to keep"):
        launch(name="c", recipe=tiny_recipe(), bucket=str(tmp_path / "b"), budget_usd=5, max_restarts=1,
               volume={"provider": "vast", "id": small})


def test_a_run_whose_volumes_machine_failed_rents_elsewhere_and_downloads_the_model(s3, frozen_market,  # noqa: F811
                                                                                       tmp_path):
    _put_model(s3)
    refresh_offers()
    offer = rank_stored_offers(*_request(_launch(tmp_path, None))).entries[1].offer
    volume_id = _volume_on(frozen_market, offer.offer_id, 100)
    run = _launch(tmp_path, {"provider": "vast", "id": volume_id, "mount_path": "/workspace/models"})
    Run.objects.filter(pk=run.pk).update(bad_machines=[offer.machine_id])  # its host died under an earlier box
    run.refresh_from_db()
    assert BoxRequest.for_run(run).volume is None

    supervisor.supervise(now=timezone.now())
    run.refresh_from_db()
    box = run.current_instance
    assert box is not None and box.machine_id != offer.machine_id and box.volume == {}
    assert run.events.filter(kind="log", message__contains=f"machine {offer.machine_id}, which failed").exists()
    (listed,) = [i for i in frozen_market.state()["instances"] if i["label"] == box.label]
    spec = Client(HTTP_AUTHORIZATION=f"Bearer {listed['env']['FLEET_AGENT_TOKEN']}").get("/api/agent/v1/spec").json()
    assert spec["model_volume"] is None and spec["model"]["kind"] == "s3"  # the model comes onto the box's disk


def test_which_offers_mount_a_volume():
    class Offer:
        def __init__(self, provider, offer_id, machine_id=""):
            self.provider, self.offer_id, self.machine_id = provider, offer_id, machine_id

    vast = {"provider": "vast", "id": "5", "machine_id": "4242"}
    runpod = {"provider": "runpod", "id": "abc", "machine_id": "", "data_center_id": "US-KS-2"}
    assert volumes.mounts(Offer("vast", "1", "4242"), vast) and not volumes.mounts(Offer("vast", "2", "17"), vast)
    assert not volumes.mounts(Offer("runpod", "NVIDIA H200:SECURE:1"), vast)
    assert volumes.mounts(Offer("runpod", "NVIDIA H200:SECURE:1"), runpod)
    assert not volumes.mounts(Offer("runpod", "NVIDIA H200:COMMUNITY:1"), runpod)
    assert volumes.lost(vast, ["17", 4242]) and not volumes.lost(vast, ["17"]) and not volumes.lost(runpod, ["4242"])


def _request(run):
    request = BoxRequest.for_run(run)
    return request.figures, request.filters
