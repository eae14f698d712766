"""The official vast.ai SDK against the simulated vast.ai for the documented search fields, bids, reboots, SSH keys
and a command the simulation does not model, as a user's script calls them."""

IMAGE = "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFq7y3Zf0sYlJ0mS3r9s8n6c1b2a3d4e5f6a7b8c9d0e script@ci"


def test_a_script_searches_by_country_datacenter_and_memory_bandwidth(vast_sdk, market):
    offers = vast_sdk.value("search_offers", query="geolocation in [SE,NO,FI] datacenter=true gpu_mem_bw>=1500",
                            limit=1000)
    expected = {o["id"] for o in market.offers() if not o["gone"] and o["rented_by"] is None and o["verified"]
                and o["geolocation"][-2:] in ("SE", "NO", "FI") and o["hosting_type"] == 1 and o["gpu_mem_bw"] >= 1500}
    assert expected and {o["id"] for o in offers} == expected
    (refused,) = vast_sdk.calls([("search_offers", {"query": {"geolocode": {"eq": 1}}, "no_default": True})])
    assert refused["error"] == "HTTPError" and "400 Client Error" in refused["message"]  # refused, not ignored


def test_a_script_changes_a_bid_reboots_and_keeps_ssh_keys(vast_sdk, market):
    offer = vast_sdk.value("search_offers", query="num_gpus=1", type="bid", order="min_bid", limit=1)[0]
    created = vast_sdk.value("create_instance", id=offer["id"], image=IMAGE, price=round(offer["min_bid"] + 0.1, 3))
    instance_id = created["new_contract"]
    market.advance(90)
    answers = vast_sdk.calls([
        ("change_bid", {"id": instance_id, "price": round(offer["min_bid"] + 0.2, 3)}),
        ("show_instance", {"id": instance_id}),
        ("reboot_instance", {"id": instance_id}),
        ("show_instance", {"id": instance_id}),
        ("create_ssh_key", {"ssh_key": PUBLIC_KEY}),
        ("show_ssh_keys", {}),
        ("recycle_instance", {"id": instance_id}),
    ])
    changed, shown, rebooted, after, key, keys, recycled = answers
    assert changed["value"]["success"] is True
    assert shown["value"]["dph_base"] == round(offer["min_bid"] + 0.2, 3)
    assert rebooted["value"]["success"] is True and after["value"]["actual_status"] in ("created", "loading")
    assert key["value"]["key"]["public_key"] == PUBLIC_KEY
    assert [k["key"] for k in keys["value"]] == [PUBLIC_KEY]
    assert recycled["error"] == "HTTPError" and "501" in recycled["message"]
