"""The official vast.ai Python SDK (`from vastai import VastAI`) against the simulated vast.ai, as a user's script."""

IMAGE = "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime"


def test_it_searches_with_a_query_string_and_with_a_query_dict(vast_sdk, market):
    offers = vast_sdk.value("search_offers", query="reliability>0.98 num_gpus=1", order="dph_total", limit=20)
    assert len(offers) == 20 and all(o["reliability"] > 0.98 and o["num_gpus"] == 1 for o in offers)
    assert [o["dph_total"] for o in offers] == sorted(o["dph_total"] for o in offers)
    # A query dict passes through as given: values as strings, booleans as words, as scripts write them.
    raw = vast_sdk.value("search_offers", query={"num_gpus": {"eq": "2"}, "verified": {"eq": "false"}},
                         no_default=True, limit=1000)
    expected = {o["id"] for o in market.offers() if o["num_gpus"] == 2 and not o["verified"]
                and not o["gone"] and o["rented_by"] is None}
    assert expected and {o["id"] for o in raw} == expected


def test_it_creates_follows_labels_and_destroys_an_instance(vast_sdk, market):
    offer = vast_sdk.value("search_offers", query="cuda_vers>=12.8 disk_space>=50", order="dph_total", limit=1)[0]
    created = vast_sdk.value("create_instance", id=offer["id"], image=IMAGE, disk=50, env={"RUN": "9"}, label="sdk")
    instance_id = created["new_contract"]
    market.advance(90)
    answers = vast_sdk.calls([
        ("show_instance", {"id": instance_id}),
        ("label_instance", {"id": instance_id, "label": "sdk-renamed"}),
        ("stop_instance", {"id": instance_id}),
        ("show_instances", {}),
        ("start_instance", {"id": instance_id}),
        ("ssh_url", {"id": instance_id}),
        ("logs", {"instance_id": instance_id, "tail": "2"}),
        ("destroy_instance", {"id": instance_id}),
        ("show_instance", {"id": instance_id}),
    ])
    shown, labelled, stopped, listing, started, ssh, logs, destroyed, gone = (a.get("value", a) for a in answers)
    assert shown["actual_status"] == "running" and shown["extra_env"] == {"RUN": "9"} and shown["label"] == "sdk"
    assert labelled == stopped == started == destroyed == {"success": True}
    assert [(i["id"], i["label"], i["actual_status"]) for i in listing] == [(instance_id, "sdk-renamed", "stopped")]
    assert ssh == f"ssh://root@{shown['ssh_host']}:{shown['ssh_port']}"
    assert len(logs.strip().splitlines()) == 2
    assert gone is None


def test_it_pages_through_more_instances_than_one_page_holds(vast_sdk, market):
    offers = vast_sdk.value("search_offers", query="num_gpus>=1", limit=30)
    answers = vast_sdk.calls([("create_instance", {"id": o["id"], "image": IMAGE, "label": f"bulk-{n % 3}"})
                              for n, o in enumerate(offers)])
    created = {a["value"]["new_contract"] for a in answers}
    everything = vast_sdk.value("show_instances")
    assert len(created) == 30 and [i["id"] for i in everything] == sorted(created)  # 25 a page: two pages
    page = vast_sdk.value("show_instances_v1", params={"select_filters": {"label": {"in": ["bulk-0"]}}, "limit": 4,
                                                        "order_by": [{"col": "id", "dir": "desc"}],
                                                        "select_cols": ["id", "label"]})
    assert page["total_instances"] == 10 and page["label_counts"] == {"bulk-0": 10}
    assert [set(i) for i in page["instances"]] == [{"id", "label"}] * 4 and page["next_token"]
    ids = [i["id"] for i in page["instances"]]
    assert ids == sorted(ids, reverse=True)
    rest = vast_sdk.value("show_instances_v1", params={"select_filters": {"label": {"in": ["bulk-0"]}}, "limit": 4,
                                                        "order_by": [{"col": "id", "dir": "desc"}],
                                                        "after_token": page["next_token"]})
    assert rest["instances"][0]["id"] < ids[-1]


def test_it_raises_the_sdk_errors_for_a_wrong_key_and_an_unknown_instance(vast_sdk):
    (listing,) = vast_sdk.calls([("show_instances", {})], api_key="not-the-key")
    assert listing["error"] == "HTTPError" and "401" in listing["message"]
    unknown, destroy = vast_sdk.calls([("show_instance", {"id": 4242}), ("destroy_instance", {"id": 4242})])
    assert unknown == {"value": None}
    assert destroy["error"] == "HTTPError" and "404" in destroy["message"]


def test_it_reports_charges_to_the_sdk(vast_sdk, market):
    offer = vast_sdk.value("search_offers", query="num_gpus=1", limit=1)[0]
    instance_id = vast_sdk.value("create_instance", id=offer["id"], image=IMAGE)["new_contract"]
    market.advance(1800)
    report = vast_sdk.value("show_invoices_v1", charges=True, start_date="2000-01-01", end_date="2100-01-01")
    assert [r["source"] for r in report["results"]] == [f"instance-{instance_id}"]
    assert report["results"][0]["amount"] > 0
    assert vast_sdk.value("show_user")["credit"] < 1000
