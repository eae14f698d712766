"""The official `vastai` CLI against the simulated vast.ai for what its documentation promises beyond the life cycle:
the search fields its help lists (its own examples among them), location by country code, billing from "running",
bids, reboots, SSH keys, and a clear answer for a command the simulation does not model."""

import json
import re

import pytest

from tests.clients.official import Cli
from tests.clients.test_vastai_cli import IMAGE, listed

PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq3x2Zf0sYlJ0mS3r9s8n6c1b2a3d4e5f6a7b8c9d0e operator@laptop"


def country(offer: dict) -> str:
    return offer["geolocation"].rsplit(",", 1)[-1].strip()


def driver(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def defaults(o: dict) -> bool:
    """The CLI's default query: verified, not external, rentable."""
    return o["verified"] and not o["external"] and o["rentable"]


# `vastai search offers --help`'s own examples, each with what it asks of an offer.
HELP_EXAMPLES = [
    ("reliability > 0.98 num_gpus=1 gpu_name=RTX_3090",
     lambda o: o["reliability"] > 0.98 and o["num_gpus"] == 1 and o["gpu_name"] == "RTX 3090"),
    ("compute_cap > 610 total_flops > 5 datacenter=True",
     lambda o: o["compute_cap"] > 610 and o["total_flops"] > 5 and o["hosting_type"] == 1),
    ("reliability>0.99 num_gpus=4 geolocation in [TW,SE]",
     lambda o: o["reliability"] > 0.99 and o["num_gpus"] == 4 and country(o) in ("TW", "SE")),
    ('reliability>0.99 gpu_name in ["RTX 4090", "RTX 3090"] geolocation notin [CN,VN]',
     lambda o: o["reliability"] > 0.99 and o["gpu_name"] in ("RTX 4090", "RTX 3090")),
    ("disk_space>146 duration>24 gpu_ram>10 cuda_vers>=12.1 direct_port_count>=2 driver_version >= 535.86.05",
     lambda o: o["disk_space"] > 146 and o["duration"] > 24 * 86400 and o["gpu_ram"] > 10_000
     and o["cuda_max_good"] >= 12.1 and o["direct_port_count"] >= 2 and driver(o["driver_version"]) >= (535, 86, 5)),
    ("cpu_arch=arm64", lambda o: o["cpu_arch"] == "arm64"),
]


@pytest.mark.parametrize(("query", "wanted"), HELP_EXAMPLES, ids=[q for q, _ in HELP_EXAMPLES])
def test_the_help_examples_find_exactly_the_offers_they_describe(vastai_cli, market, query, wanted):
    found = vastai_cli.json("search", "offers", query, "--limit", "1000")
    expected = {o["id"] for o in listed(market) if defaults(o) and wanted(o)}
    assert {o["id"] for o in found} == expected


def test_the_unverified_help_example_orders_by_gpu_count(vastai_cli, market):
    found = vastai_cli.json("search", "offers", "reliability > 0.99  num_gpus>=4 verified=False", "-o", "num_gpus-",
                            "--limit", "1000")
    expected = {o["id"] for o in listed(market) if not o["verified"] and o["reliability"] > 0.99
                and o["num_gpus"] >= 4}
    assert expected and {o["id"] for o in found} == expected
    assert [o["num_gpus"] for o in found] == sorted((o["num_gpus"] for o in found), reverse=True)


@pytest.mark.parametrize(("query", "wanted"), [
    ("geolocation in [US,CA]", lambda o: country(o) in ("US", "CA")),
    ("geolocation notin [US,CA]", lambda o: country(o) not in ("US", "CA")),
    ("geolocation=US", lambda o: country(o) == "US"),
    ("geolocation!=US", lambda o: country(o) != "US"),
    ("geolocation=se", lambda o: country(o) == "SE"),
])
def test_location_is_matched_by_country_code(vastai_cli, market, query, wanted):
    found = vastai_cli.json("search", "offers", query, "--limit", "1000")
    expected = {o["id"] for o in listed(market) if defaults(o) and wanted(o)}
    assert expected and {o["id"] for o in found} == expected


def test_a_location_that_is_no_country_code_is_refused(vastai_cli):
    done = vastai_cli.run("search", "offers", "geolocation=Sweden", "--raw")
    assert '"status_code": 400' in done.stderr and "two-letter country codes" in done.stderr


@pytest.mark.parametrize(("query", "wanted"), [
    ("datacenter=True", lambda o: o["hosting_type"] == 1),
    ("datacenter=False", lambda o: o["hosting_type"] == 0),
    ("gpu_mem_bw>=3000", lambda o: o["gpu_mem_bw"] >= 3000),
    ("vms_enabled=True", lambda o: o["vms_enabled"]),
    ("ubuntu_version=22.04", lambda o: o["os_version"] == "22.04"),
    ("gpu_max_power<=400", lambda o: o["gpu_max_power"] <= 400),
    ("gpu_max_temp>=87", lambda o: o["gpu_max_temp"] >= 87),
    ("static_ip=True pcie_bw>30", lambda o: o["static_ip"] and o["pcie_bw"] > 30),
    ("dlperf_usd>60 flops_usd>40", lambda o: o["dlperf_per_dphtotal"] > 60 and o["flops_per_dphtotal"] > 40),
    ("cpu_ram>=256 cpu_ghz>2.5", lambda o: o["cpu_ram"] >= 256_000 and o["cpu_ghz"] > 2.5),
    ("storage_cost<0.1 inet_up_cost<0.005", lambda o: o["storage_cost"] < 0.1 and o["inet_up_cost"] < 0.005),
])
def test_every_listed_search_field_filters(vastai_cli, market, query, wanted):
    found = vastai_cli.json("search", "offers", query, "--limit", "1000")
    offers = [o for o in listed(market) if defaults(o)]
    expected = {o["id"] for o in offers if wanted(o)}
    assert expected and len(expected) < len(offers)  # it keeps some and drops some: it filters
    assert {o["id"] for o in found} == expected


def test_a_field_the_simulation_does_not_model_is_refused_not_ignored(vastai_cli):
    done = vastai_cli.run("search", "offers", "geolocode=42", "--raw")
    assert '"status_code": 400' in done.stderr and not done.stdout.strip()
    assert "'geolocode' is not modelled by the simulated marketplace" in done.stderr


def test_storage_bills_from_creation_and_gpu_from_running(clients_bin, client_home, frozen_market):
    market = frozen_market
    cli = Cli(clients_bin / "vastai", market.origin, client_home)
    offer = cli.json("search", "offers", "num_gpus=1 disk_space>=50", "-o", "dph+", "--limit", "1")[0]
    instance_id = cli.json("create", "instance", str(offer["id"]), "--image", IMAGE, "--disk", "50")["new_contract"]
    market.advance(60)
    assert cli.json("show", "instance", str(instance_id))["actual_status"] == "loading"
    report = cli.json("show", "invoices-v1", "--charges", "-s", "2000-01-01", "-e", "2100-01-01")
    (result,) = report["results"]
    amounts = {item["type"]: item["amount"] for item in result["items"]}
    assert amounts.get("gpu", 0) == 0 and amounts["disk"] > 0  # the image pull bills storage only
    market.advance(3630)  # an hour after the boot's 90 s
    report = cli.json("show", "invoices-v1", "--charges", "-s", "2000-01-01", "-e", "2100-01-01")
    amounts = {item["type"]: item["amount"] for item in report["results"][0]["items"]}
    assert amounts["gpu"] == pytest.approx(offer["dph_base"], abs=1e-4)
    assert amounts["disk"] == pytest.approx(offer["storage_cost"] * 50 * (3690 / 3600) / 720, abs=1e-5)


def test_a_bid_changes_and_an_outbid_instance_wins_its_machine_back(clients_bin, client_home, frozen_market):
    market = frozen_market
    cli = Cli(clients_bin / "vastai", market.origin, client_home)
    offer = cli.json("search", "offers", "num_gpus=1", "--type=bid", "-o", "min_bid+", "--limit", "1")[0]
    created = cli.json("create", "instance", str(offer["id"]), "--image", IMAGE, "--bid_price",
                       str(round(offer["min_bid"] + 0.05, 3)))
    instance_id = created["new_contract"]
    market.advance(90)
    market.reclaim(instance_id)
    outbid = cli.json("show", "instance", str(instance_id))
    assert (outbid["actual_status"], outbid["intended_status"]) == ("stopped", "running")
    assert outbid["min_bid"] > offer["min_bid"]  # the bid that took it is now the one to beat

    done = cli.run("change", "bid", str(instance_id), "--price", str(round(outbid["min_bid"] + 0.1, 3)))
    assert done.returncode == 0 and "bid price changed" in done.stdout, done.stderr
    resumed = cli.json("show", "instance", str(instance_id))
    assert resumed["actual_status"] in ("created", "loading")
    assert resumed["dph_base"] == pytest.approx(outbid["min_bid"] + 0.1, abs=1e-3)
    market.advance(90)
    assert cli.json("show", "instance", str(instance_id))["actual_status"] == "running"

    on_demand = cli.json("search", "offers", "num_gpus=1", "-o", "dph+", "--limit", "1")[0]
    other = cli.json("create", "instance", str(on_demand["id"]), "--image", IMAGE)["new_contract"]
    refused = cli.run("change", "bid", str(other), "--price", "1.0")
    assert "Failed with error 400" in refused.stderr and "no bid to change" in refused.stderr


def test_a_reboot_restarts_the_container_on_the_same_machine(clients_bin, client_home, frozen_market):
    market = frozen_market
    cli = Cli(clients_bin / "vastai", market.origin, client_home)
    offer = cli.json("search", "offers", "num_gpus=1", "-o", "dph+", "--limit", "1")[0]
    instance_id = cli.json("create", "instance", str(offer["id"]), "--image", IMAGE)["new_contract"]
    market.advance(600)
    done = cli.run("reboot", "instance", str(instance_id))
    assert done.returncode == 0 and f"Rebooting instance {instance_id}" in done.stdout, done.stderr
    rebooted = cli.json("show", "instance", str(instance_id))
    assert rebooted["actual_status"] in ("created", "loading") and rebooted["machine_id"] == offer["machine_id"]
    market.advance(90)
    assert cli.json("show", "instance", str(instance_id))["actual_status"] == "running"
    billed = next(i for i in market.state()["instances"] if i["id"] == instance_id)["billing"]
    assert billed["gpu"] == pytest.approx(offer["dph_base"] * (600 - 90) / 3600, abs=1e-5)  # not while rebooting


def test_ssh_keys_are_added_listed_attached_detached_and_deleted(vastai_cli, market, tmp_path):
    offer = vastai_cli.json("search", "offers", "num_gpus=1", "--limit", "1")[0]
    instance_id = vastai_cli.json("create", "instance", str(offer["id"]), "--image", IMAGE)["new_contract"]
    public = tmp_path / "id_ed25519.pub"
    public.write_text(PUBLIC_KEY + "\n")

    created = vastai_cli.run("create", "ssh-key", PUBLIC_KEY, "-y")
    assert created.returncode == 0 and "ssh-key created" in created.stdout, created.stderr
    (key,) = vastai_cli.json("show", "ssh-keys")
    assert key["key"] == PUBLIC_KEY and isinstance(key["id"], int)

    attached = vastai_cli.run("attach", "ssh", str(instance_id), str(public))
    assert attached.returncode == 0 and f"attached to instance {instance_id}" in attached.stdout, attached.stderr
    assert len(vastai_cli.json("show", "ssh-keys")) == 1  # the same key, not a second copy
    detached = vastai_cli.run("detach", "ssh", str(instance_id), str(key["id"]))
    assert detached.returncode == 0 and "detached" in detached.stdout, detached.stderr
    again = vastai_cli.run("detach", "ssh", str(instance_id), str(key["id"]))
    assert "Failed with error 404" in again.stderr

    assert vastai_cli.run("delete", "ssh-key", str(key["id"])).returncode == 0
    assert vastai_cli.json("show", "ssh-keys") == []
    bad = vastai_cli.run("attach", "ssh", str(instance_id), "ssh-rsa not-a-key")
    assert "Failed with error 400" in bad.stderr and "OpenSSH public key" in bad.stderr


def test_a_command_the_simulation_does_not_model_says_so(vastai_cli, market):
    offer = vastai_cli.json("search", "offers", "num_gpus=1", "--limit", "1")[0]
    instance_id = vastai_cli.json("create", "instance", str(offer["id"]), "--image", IMAGE)["new_contract"]
    done = vastai_cli.run("recycle", "instance", str(instance_id))
    assert re.search(r"Failed with error 501: `recycle instance` .* is not supported by the simulated marketplace",
                     done.stderr), done.stderr
    raw = vastai_cli.run("prepay", "instance", str(instance_id), "10", "--raw")
    assert json.loads(raw.stderr.strip().splitlines()[-1])["msg"].startswith("`prepay instance`")
