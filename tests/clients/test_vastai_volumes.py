"""vast.ai volumes through the official CLI and SDK against the simulated vast.ai: search volume offers, create, show,
link to an instance at a mount path on its own machine, delete; and the product's client reading the same volume and
renting with it."""

import re

from fleet.providers.records import RentRequest, VolumeMount
from fleet.providers.vast import VastClient
from tests.marketplace import MARKET_KEY

IMAGE = "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime"


def test_the_cli_searches_creates_shows_links_and_deletes_a_volume(vastai_cli, market):
    offers = vastai_cli.json("search", "volumes", "disk_space>200", "--limit", "5")
    assert offers and all(o["disk_space"] > 200 and o["verified"] for o in offers)
    ask = offers[0]
    created = vastai_cli.json("create", "volume", str(ask["id"]), "-s", "100", "-n", "weights")
    assert created["success"] is True and re.fullmatch(r"V\.\d+", created["volume_name"])
    (volume,) = vastai_cli.json("show", "volumes")
    assert (volume["label"], volume["disk_space"], volume["machine_id"]) == ("weights", 100, ask["machine_id"])
    assert f"V.{volume['id']}" == created["volume_name"] and volume["instances"] == []
    table = vastai_cli.run("show", "volumes")
    assert table.returncode == 0 and str(volume["id"]) in table.stdout and "weights" in table.stdout

    # Linked to an instance on its own machine at the mount path the CLI asks for.
    instance_id = vastai_cli.json("create", "instance", str(ask["id"]), "--image", IMAGE, "--link-volume",
                                  str(volume["id"]), "--mount-path", "/workspace/models")["new_contract"]
    shown = vastai_cli.json("show", "instance", str(instance_id))
    assert [(v["id"], v["mount_path"]) for v in shown["volume_info"]] == [(volume["id"], "/workspace/models")]
    assert vastai_cli.json("show", "volumes")[0]["instances"] == [instance_id]
    in_use = vastai_cli.run("delete", "volume", str(volume["id"]))
    assert "Failed with error 400" in in_use.stderr or "400" in in_use.stdout + in_use.stderr

    # The volume outlives the instance; deleted, it is gone.
    assert vastai_cli.run("destroy", "instance", str(instance_id), "-y").returncode == 0
    assert vastai_cli.json("show", "volumes")[0]["instances"] == []
    assert vastai_cli.run("delete", "volume", str(volume["id"])).returncode == 0
    assert vastai_cli.json("show", "volumes") == []


def test_a_volume_links_only_on_its_own_machine(vastai_cli, market):
    here, elsewhere = vastai_cli.json("search", "volumes", "disk_space>100", "--limit", "2")
    vastai_cli.json("create", "volume", str(here["id"]), "-s", "50")
    (volume,) = vastai_cli.json("show", "volumes")
    refused = vastai_cli.run("create", "instance", str(elsewhere["id"]), "--image", IMAGE, "--link-volume",
                             str(volume["id"]), "--mount-path", "/data")
    assert "Failed with error 400" in refused.stderr and "on its own machine" in refused.stderr, refused.stderr


def test_the_sdk_creates_an_instance_with_a_new_volume(vast_sdk, market):
    ask = vast_sdk.value("search_volumes", query="disk_space>100", limit=1)[0]
    created = vast_sdk.value("create_instance", id=ask["id"], image=IMAGE, create_volume=ask["id"], volume_size=60,
                             mount_path="/root/volume", volume_label="made-with-it")
    volumes = vast_sdk.value("show_volumes")
    assert [(v["label"], v["disk_space"], v["instances"]) for v in volumes] == [
        ("made-with-it", 60, [created["new_contract"]])]
    shown = vast_sdk.value("show_instance", id=created["new_contract"])
    assert shown["volume_info"][0]["mount_path"] == "/root/volume"


def test_the_products_client_lists_a_volume_and_rents_with_it_linked(vastai_cli, market):
    ask = vastai_cli.json("search", "volumes", "disk_space>200", "--limit", "1")[0]
    vastai_cli.json("create", "volume", str(ask["id"]), "-s", "120", "-n", "qwen")
    with VastClient(market.base_url, MARKET_KEY, max_retries=1) as client:
        (volume,) = client.list_volumes()
        assert (volume.provider, volume.name, volume.size_gb, volume.machine_id, volume.usable) == (
            "vast", "qwen", 120.0, str(ask["machine_id"]), True)
        assert volume.storage_usd_per_gb_month is not None and volume.storage_usd_per_gb_month > 0
        instance_id = client.rent(RentRequest(offer_id=str(ask["id"]), image=IMAGE, disk_gb=50, label="with-volume",
                                              env={}, volume=VolumeMount(volume.volume_id, "/workspace/models")))
    shown = vastai_cli.json("show", "instance", instance_id)
    assert shown["volume_info"][0]["id"] == int(volume.volume_id)
    assert shown["volume_info"][0]["mount_path"] == "/workspace/models"
