"""The official `vastai` CLI (PyPI vastai, pinned in tests/clients/requirements.txt) against the simulated
vast.ai: every command the product's users run by hand, as the CLI sends it and reads the answer."""

import re

from tests.clients.official import Cli
from tests.marketplace import MARKET_KEY

IMAGE = "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime"


def listed(market) -> list[dict]:
    return [o for o in market.offers() if not o["gone"] and o["rented_by"] is None]


def driver(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_it_filters_on_the_numbers_the_cli_sends_as_strings(vastai_cli, market):
    offers = vastai_cli.json("search", "offers", "reliability>0.98 num_gpus=1 gpu_ram>=80", "--limit", "1000")
    expected = {o["id"] for o in listed(market) if o["verified"] and o["reliability"] > 0.98 and o["num_gpus"] == 1
                and o["gpu_ram"] >= 80_000}
    assert expected and {o["id"] for o in offers} == expected


def test_it_compares_driver_versions_and_cuda_as_vast_ai_does(vastai_cli, market):
    offers = vastai_cli.json("search", "offers", "driver_version>=570.0.0 cuda_vers>=12.8", "--limit", "1000")
    expected = {o["id"] for o in listed(market) if o["verified"] and driver(o["driver_version"]) >= (570, 0, 0)
                and o["cuda_max_good"] >= 12.8}
    assert expected and {o["id"] for o in offers} == expected
    older = vastai_cli.json("search", "offers", "driver_version<570.0.0", "--limit", "1000")
    assert older and all(driver(o["driver_version"]) < (570,) for o in older)


def test_it_takes_lists_with_in_and_notin(vastai_cli, market):
    found = vastai_cli.json("search", "offers", "gpu_name in [H200,H200_NVL]", "--limit", "1000")
    names = {o["gpu_name"] for o in found}
    assert names == {"H200", "H200 NVL"}
    others = vastai_cli.json("search", "offers", "gpu_name notin [H200,H200_NVL,B200]", "--limit", "1000")
    assert others and not {o["gpu_name"] for o in others} & {"H200", "H200 NVL", "B200"}


def test_it_lifts_a_default_filter_with_any(vastai_cli, market):
    unverified = [o for o in listed(market) if not o["verified"]]
    assert unverified
    default = vastai_cli.json("search", "offers", "num_gpus>=1", "--limit", "1000")
    everything = vastai_cli.json("search", "offers", "verified=any", "--limit", "1000")
    assert all(o["verified"] for o in default)
    assert {o["id"] for o in unverified} <= {o["id"] for o in everything}
    only_unverified = vastai_cli.json("search", "offers", "verified=false", "--limit", "1000")
    assert {o["id"] for o in only_unverified} == {o["id"] for o in unverified}


def test_it_orders_by_the_cli_default_score_and_by_price(vastai_cli):
    by_score = vastai_cli.json("search", "offers", "num_gpus=1", "--limit", "40")
    scores = [o["score"] for o in by_score]
    assert len(scores) == 40 and scores == sorted(scores, reverse=True)
    cheapest = vastai_cli.json("search", "offers", "num_gpus=1", "-o", "dph+", "--limit", "40")
    prices = [o["dph_total"] for o in cheapest]
    assert prices == sorted(prices)
    assert vastai_cli.json("search", "offers", "num_gpus=1", "-o", "dph+", "--limit", "3") == cheapest[:3]


def test_it_prints_the_offer_table(vastai_cli):
    query = ("search", "offers", "gpu_name=H200 num_gpus=1", "-o", "dph+", "--limit", "5")
    done = vastai_cli.run(*query)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if re.search(r"\b\d{8}\b", line)]
    assert "Model" in done.stdout and "$/hr" in done.stdout
    assert [re.search(r"\b(\d{8})\b", row).group(1) for row in rows] == [str(o["id"]) for o in vastai_cli.json(*query)]
    assert all(" H200 " in row for row in rows)


def test_it_rents_shows_labels_stops_starts_and_destroys_an_instance(vastai_cli, market):
    offer = vastai_cli.json("search", "offers", "cuda_vers>=12.8 disk_space>=100", "-o", "dph+", "--limit", "1")[0]
    created = vastai_cli.json("create", "instance", str(offer["id"]), "--image", IMAGE, "--disk", "100",
                              "--env", "-e RUN=7 -p 8000:8000", "--label", "cli-run", "--onstart-cmd", "echo hi")
    assert created["success"] is True
    instance_id = created["new_contract"]

    shown = vastai_cli.json("show", "instance", str(instance_id))
    assert shown["id"] == instance_id and shown["label"] == "cli-run" and shown["image_uuid"] == IMAGE
    assert shown["extra_env"] == {"RUN": "7"} and shown["actual_status"] in ("created", "loading")
    assert shown["gpu_name"] == offer["gpu_name"] and shown["machine_id"] == offer["machine_id"]

    market.advance(90)
    listing = vastai_cli.json("show", "instances")
    assert [(i["id"], i["actual_status"]) for i in listing] == [(instance_id, "running")]
    assert "8000/tcp" in listing[0]["ports"]

    assert "set to renamed" in vastai_cli.run("label", "instance", str(instance_id), "renamed").stdout
    assert vastai_cli.run("stop", "instance", str(instance_id)).returncode == 0
    stopped = vastai_cli.json("show", "instance", str(instance_id))
    assert (stopped["label"], stopped["actual_status"], stopped["intended_status"]) == ("renamed", "stopped", "stopped")
    assert vastai_cli.run("start", "instance", str(instance_id)).returncode == 0
    market.advance(90)
    assert vastai_cli.json("show", "instance", str(instance_id))["actual_status"] == "running"

    assert vastai_cli.run("destroy", "instance", str(instance_id), "-y").returncode == 0
    gone = vastai_cli.run("show", "instance", str(instance_id))
    assert gone.returncode == 1 and "not found or no longer exists" in gone.stderr
    assert vastai_cli.json("show", "instances") == []
    assert [i["state"] for i in market.state()["instances"]] == ["destroyed"]


def test_it_shows_an_instance_table_and_its_logs(vastai_cli, market):
    offer = vastai_cli.json("search", "offers", "cuda_vers>=12.8", "-o", "dph+", "--limit", "1")[0]
    instance_id = vastai_cli.json("create", "instance", str(offer["id"]), "--image", IMAGE, "--label", "logs",
                                  "--onstart-cmd", "python -m training.agent")["new_contract"]
    market.advance(90)
    table = vastai_cli.run("show", "instances")
    assert table.returncode == 0, table.stderr
    assert str(instance_id) in table.stdout and "running" in table.stdout and "logs" in table.stdout

    logs = vastai_cli.run("logs", str(instance_id))
    assert logs.returncode == 0, logs.stderr
    assert f"Pulling image {IMAGE}" in logs.stdout and "Container started: python -m training.agent" in logs.stdout
    tail = vastai_cli.run("logs", str(instance_id), "--tail", "1").stdout.strip().splitlines()
    assert len(tail) == 1 and "Container started" in tail[0]


def test_it_bills_what_invoices_and_charges_report(clients_bin, client_home, frozen_market):
    market = frozen_market  # the clock moves only with advance(): the reports and the market bill the same seconds
    vastai_cli = Cli(clients_bin / "vastai", market.origin, client_home)
    offer = vastai_cli.json("search", "offers", "num_gpus=1", "-o", "dph+", "--limit", "1")[0]
    created = vastai_cli.json("create", "instance", str(offer["id"]), "--image", IMAGE, "--disk", "20")
    instance_id = created["new_contract"]
    market.advance(3600)
    billed = next(i for i in market.state()["instances"] if i["id"] == instance_id)["billing"]

    # up to a date past the simulated clock (frozen, it runs ahead of the CLI's "now", and the GPU line begins at
    # "running", after the boot)
    rows = vastai_cli.json("show", "invoices", "-e", "2100-01-01")
    charges = [row for row in rows if row.get("instance_id") == instance_id]
    assert {row["type"] for row in charges} == {"charge"}
    assert abs(sum(row["amount"] for row in charges) - billed["total"]) < 1e-6
    assert any(row["type"] == "payment" for row in rows)

    report = vastai_cli.json("show", "invoices-v1", "--charges", "-s", "2000-01-01", "-e", "2100-01-01")
    (result,) = report["results"]
    assert result["source"] == f"instance-{instance_id}" and report["total"] == 1
    assert abs(result["amount"] - billed["total"]) < 1e-6
    assert {item["type"] for item in result["items"]} == {"gpu", "disk"}

    table = vastai_cli.run("show", "invoices-v1", "--charges", "-s", "2000-01-01", "-e", "2100-01-01")
    assert table.returncode == 0, table.stderr
    assert str(instance_id) in table.stdout and "Showing 1 of 1 results" in table.stdout
    invoices = vastai_cli.json("show", "invoices-v1", "--invoices", "-s", "2000-01-01", "-e", "2100-01-01")
    assert invoices["total"] == 1 and invoices["results"][0]["description"] == "Starting credit"

    user = vastai_cli.json("show", "user")
    assert abs(user["credit"] - (1000 - billed["total"])) < 1e-3


def test_it_answers_a_wrong_key_as_the_cli_expects(vastai_cli):
    for command in (("show", "instances"), ("search", "offers", "num_gpus=1")):
        done = vastai_cli.run(*command, api_key="not-the-key")
        assert "Failed with error 401" in done.stderr, done.stderr
        assert "not-the-key" not in done.stderr + done.stdout  # the CLI shows only the key's last characters


def test_it_answers_an_unknown_instance_as_the_cli_expects(vastai_cli):
    shown = vastai_cli.run("show", "instance", "12345")
    assert shown.returncode == 1 and "Instance 12345 not found or no longer exists." in shown.stderr
    for command in (("destroy", "instance", "12345", "-y"), ("label", "instance", "12345", "x"),
                    ("stop", "instance", "12345")):
        done = vastai_cli.run(*command)
        assert re.search(r"Failed with error 404: Instance 12345 not found", done.stderr), (command, done.stderr)


def test_it_refuses_a_rent_of_a_taken_offer_with_the_cli_error(vastai_cli, market):
    offer = vastai_cli.json("search", "offers", "num_gpus=1", "--limit", "1")[0]
    assert vastai_cli.json("create", "instance", str(offer["id"]), "--image", IMAGE)["success"] is True
    again = vastai_cli.run("create", "instance", str(offer["id"]), "--image", IMAGE)
    assert "Failed with error 400" in again.stderr and "no_such_ask" in again.stderr
    assert MARKET_KEY not in again.stderr


def test_it_filters_the_instance_list_by_label_and_status(vastai_cli, market):
    offers = vastai_cli.json("search", "offers", "num_gpus=1", "-o", "dph+", "--limit", "2")
    ids = {label: vastai_cli.json("create", "instance", str(o["id"]), "--image", IMAGE, "--label", label)
           ["new_contract"] for label, o in zip(("alpha", "beta"), offers, strict=True)}
    market.advance(90)
    assert vastai_cli.run("show", "instances", "--label", "alpha", "-q").stdout.split() == [str(ids["alpha"])]
    running = vastai_cli.run("show", "instances", "-s", "running", "-q").stdout.split()
    assert sorted(running) == sorted(str(i) for i in ids.values())
    assert vastai_cli.run("show", "instances", "-s", "exited", "-q").stdout.split() == []


def test_it_answers_the_new_search_route_like_the_old(vastai_cli):
    query = ("search", "offers", "gpu_name=H200 reliability>0.95", "-o", "dph+", "--limit", "10")
    assert vastai_cli.json(*query, "--new") == vastai_cli.json(*query)
