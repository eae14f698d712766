"""What the vast.ai client does with answers that are not what the API documents, over a real local server."""

import json
import re
import threading
from decimal import Decimal
from urllib.parse import parse_qs, urlparse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleet.providers.errors import (AuthenticationFailed, MalformedResponse, OfferUnavailable, OutcomeUnknown,
                                   ProviderUnavailable, RequestRefused)
from fleet.providers.records import RentRequest
from fleet.ranking.filters import country_code
from fleet.providers.vast import VastClient

GOOD_OFFER = {
    "id": 101, "gpu_name": "H200", "num_gpus": 1, "gpu_ram": 143771, "compute_cap": 900, "cuda_max_good": 12.8,
    "driver_version": "570.124.06", "disk_space": 500, "inet_up": 900.0, "inet_down": 1500.0,
    "inet_up_cost": 0.02, "inet_down_cost": 0.01, "storage_cost": 0.15, "dph_base": 1.15, "dph_total": 1.2,
    "min_bid": 0.7, "reliability2": 0.987, "verified": True, "rentable": True, "geolocation": "Sweden, SE",
    "machine_id": 9, "host_id": 3, "dlperf": 250.0, "total_flops": 700.0,
}


class _Scripted(BaseHTTPRequestHandler):
    replies: list = []  # (status, body bytes[, headers]) answered in order

    def _answer(self):
        self.server.requests.append((self.command, self.path))
        status, body, *headers = self.server.replies.pop(0)
        self.send_response(status)
        for name, value in (headers[0] if headers else {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def scripted():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    server.replies, server.requests = [], []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = VastClient(f"http://127.0.0.1:{server.server_port}/api/v0", "key", backoff_s=0.01, max_retries=2)
    yield server, client
    client.close()
    server.shutdown()


def test_it_skips_a_malformed_offer_and_keeps_the_rest(scripted):
    server, client = scripted
    broken = {**GOOD_OFFER, "id": 102, "gpu_ram": "lots"}
    missing = {k: v for k, v in GOOD_OFFER.items() if k != "dph_total"} | {"id": 103}
    server.replies.append((200, json.dumps({"offers": [GOOD_OFFER, broken, missing, "junk"]}).encode()))
    offers = client.search_offers()
    assert [o.offer_id for o in offers] == ["101"]
    assert len(offers.skipped) == 3
    assert any("offer 102" in note and "gpu_ram" in note for note in offers.skipped)
    assert any("offer 103" in note and "dph_total" in note for note in offers.skipped)


def test_it_converts_units_once(scripted):
    server, client = scripted
    server.replies.append((200, json.dumps({"offers": [GOOD_OFFER]}).encode()))
    (offer,) = client.search_offers()
    assert offer.gpu_ram_gb == 140.4  # 143771 MiB
    assert offer.compute_capability == 90  # compute_cap 900
    assert offer.inet_down_mbps == 1500.0
    assert str(offer.total_usd_per_hour) == "1.2" and str(offer.storage_usd_per_gb_month) == "0.15"
    assert country_code(offer.geolocation) == "SE"


def test_it_says_so_when_the_body_is_not_json(scripted):
    server, client = scripted
    server.replies.append((200, b"<html>maintenance</html>"))
    with pytest.raises(MalformedResponse, match="not JSON"):
        client.search_offers()


def test_it_says_so_when_the_list_is_missing(scripted):
    server, client = scripted
    server.replies.append((200, b'{"results": []}'))
    with pytest.raises(MalformedResponse, match="without an 'offers' list"):
        client.search_offers()


def test_it_gives_up_after_its_retries_on_5xx(scripted):
    server, client = scripted
    server.replies.extend([(502, b"{}")] * 3)
    with pytest.raises(ProviderUnavailable, match="HTTP 502 after 3 tries"):
        client.list_instances()
    assert len(server.requests) == 3


def test_it_never_retries_a_rent_that_may_have_happened(scripted):
    server, client = scripted
    server.replies.extend([(502, b"{}"), (200, b'{"success": true, "new_contract": 7}')])
    with pytest.raises(OutcomeUnknown):
        client.rent(RentRequest(offer_id="101", image="img", disk_gb=250, label="fleet-1", env={}))
    assert len(server.requests) == 1  # one PUT, not two


@pytest.mark.parametrize("body", [b'{"success": true}', b'{"success": true, "new_contract": "7"}',
                                  b"<html>rented</html>", b"[]"])
def test_an_accepted_rent_whose_answer_names_no_instance_may_have_rented(scripted, body):
    server, client = scripted
    server.replies.append((200, body))
    with pytest.raises(OutcomeUnknown, match="it may have rented: reconcile by label") as caught:
        client.rent(RentRequest(offer_id="101", image="img", disk_gb=250, label="fleet-1", env={}))
    assert isinstance(caught.value, MalformedResponse)  # and the answer broke the API's contract


INSTANCE = {"id": 7, "label": "moe-fleet-1", "actual_status": "running", "intended_status": "running",
            "dph_total": 0.52, "num_gpus": 1, "gpu_name": "H200", "machine_id": 9, "ssh_port": 40022}


def test_one_unreadable_instance_neither_hides_nor_stops_the_others(scripted):
    server, client = scripted
    odd = {**INSTANCE, "id": 8, "label": "moe-fleet-2", "dph_total": "0.5", "is_bid": "false", "ssh_port": 1e400,
           "status_msg": "pulling\x00 layer\nretrying"}
    nameless = {**INSTANCE, "id": "nine"}
    server.replies.append((200, json.dumps({"instances": [INSTANCE, odd, nameless, "junk"]}).encode()))
    listed = client.list_instances()
    assert [i.instance_id for i in listed] == ["7", "8"] and listed.unreadable == 2
    assert listed.unreadable_labels == ("moe-fleet-1", "")  # what an entry without an id may still be told by
    assert listed.may_hide("moe-fleet-3")  # the junk entry could be any machine
    good, kept = listed
    assert good.usd_per_hour == Decimal("0.52") and good.problems == ()
    assert (kept.label, kept.status, kept.usd_per_hour, kept.is_bid, kept.ssh_port) == (
        "moe-fleet-2", "running", None, False, None)  # its price unknown, not 0
    assert kept.status_msg == "pulling  layer\nretrying"  # no NUL reaches a text column
    assert [p.split(" ")[0] for p in kept.problems] == ["is_bid", "dph_total", "ssh_port"]


def test_a_destroy_answered_with_a_redirect_is_no_destroy(scripted):
    server, client = scripted
    server.replies.append((301, b"{}"))
    with pytest.raises(MalformedResponse, match="destroy of instance 7 with HTTP 301"):
        client.destroy("7")


REPORT = {"type": "instance", "source": "instance-7", "amount": 1.5, "start": 1.7e9, "end": 1.7e9 + 3600,
          "items": [{"type": "gpu", "amount": 1.25, "start": 1.7e9, "end": 1.7e9 + 3600,
                     "description": "1.000 hours at $1.250/hour"},
                    {"type": "disk", "amount": 0.25, "start": 1.7e9, "end": 1.7e9 + 3600}]}


def test_it_reads_the_charge_report_as_vast_ai_gives_it(scripted):
    server, client = scripted
    volume = {"type": "volume", "source": "volume-3", "amount": 0.1, "items": []}
    server.replies.append((200, json.dumps({"results": [REPORT], "next_token": "p2"}).encode()))
    server.replies.append((200, json.dumps({"results": [volume, {**REPORT, "source": "instance-9"}],
                                            "next_token": None}).encode()))
    lines = client.charges()
    assert [(c.instance_id, c.kind, str(c.amount_usd)) for c in lines] == [
        ("7", "gpu", "1.25"), ("7", "disk", "0.25"), ("9", "gpu", "1.25"), ("9", "disk", "0.25")]
    (_, first), (_, second) = server.requests
    query = json.loads(parse_qs(urlparse(first).query)["select_filters"][0])
    assert set(query["day"]) == {"gte", "lte"} and "after_token=p2" in second  # the range it needs, every page


def test_a_charge_line_it_cannot_read_leaves_out_its_instance_not_the_report(scripted):
    server, client = scripted
    broken = {**REPORT, "items": [REPORT["items"][0], {"type": "gpu", "amount": 1.0}]}  # a line without times
    nameless = {**REPORT, "source": "volume?", "metadata": None}
    good = {**REPORT, "source": "instance-9"}
    server.replies.append((200, json.dumps({"results": [broken, nameless, good, "junk"], "next_token": None}).encode()))
    report = client.charges()
    assert [(c.instance_id, c.kind) for c in report] == [("9", "gpu"), ("9", "disk")]  # none of 7's, not even one
    assert list(report.unreadable) == ["7"] and "charge line" in report.unreadable["7"]
    assert len(report.skipped) == 3 and "names no instance" in report.skipped[1]


def test_it_keeps_the_key_out_of_its_repr():
    client = VastClient("http://127.0.0.1:9/api/v0", "secret-key-value")
    assert "secret-key-value" not in repr(client)


# One listing per kind of junk, each naming the field it is in. "1e400" and "-1e400" are written into the body as
# bare JSON numbers (Python reads them as infinities), "NaN" as JSON's NaN extension.
_INF, _NEG_INF, _NAN = "<1e400>", "<-1e400>", "<NaN>"
BAD_LISTINGS = [
    ("id", _INF), ("id", 1.5), ("id", "104"), ("id", -3), ("id", True), ("id", None),
    ("num_gpus", _INF), ("num_gpus", 1.5), ("num_gpus", 0), ("num_gpus", "2"), ("num_gpus", None),
    ("compute_cap", _INF), ("compute_cap", _NAN), ("compute_cap", -900), ("compute_cap", "900"),
    ("gpu_ram", _NAN), ("gpu_ram", -1), ("gpu_ram", [143771]),
    ("cuda_max_good", _NAN), ("cuda_max_good", _INF), ("cuda_max_good", "12.8"),
    ("disk_space", _NAN), ("disk_space", -500), ("disk_space", None),
    ("inet_up", _NAN), ("inet_down", _NEG_INF), ("inet_down", "1500"),
    ("dph_total", _INF), ("dph_total", -1), ("dph_total", "1.2"), ("dph_base", _NAN), ("dph_base", False),
    ("storage_cost", _INF), ("inet_up_cost", -0.01), ("inet_down_cost", "0.01"), ("min_bid", _INF),
    ("reliability2", 1.5), ("reliability2", _NAN), ("reliability2", "0.99"),
    ("verified", "false"), ("verified", 0), ("is_bid", "false"), ("rentable", "no"),
    ("gpu_name", ""), ("gpu_name", 42), ("gpu_name", "H200\x00"), ("gpu_name", None),
    ("driver_version", 570), ("geolocation", ["SE"]), ("machine_id", "m-9"), ("host_id", 1.5),
    ("dlperf", _NAN), ("total_flops", _INF), ("total_flops", -700),
]


def _catalogue(listings: list[dict]) -> bytes:
    text = json.dumps({"offers": listings})
    for marker, literal in ((_INF, "1e400"), (_NEG_INF, "-1e400"), (_NAN, "NaN")):
        text = text.replace(json.dumps(marker), literal)
    return text.encode()


def test_it_skips_each_bad_listing_with_the_field_named_and_keeps_every_good_one(scripted):
    server, client = scripted
    listings = [GOOD_OFFER, {**GOOD_OFFER, "id": 102.0, "num_gpus": 2.0}]  # whole numbers written as floats
    for i, (field, value) in enumerate(BAD_LISTINGS):
        listing = {**GOOD_OFFER, "id": 1000 + i, field: value}
        if value is None:
            del listing[field]  # a key the listing leaves out
        listings.append(listing)
    server.replies.append((200, _catalogue(listings)))
    offers = client.search_offers()
    assert [(o.offer_id, o.num_gpus) for o in offers] == [("101", 1), ("102", 2)]
    assert len(offers.skipped) == len(BAD_LISTINGS)
    for note, (field, _) in zip(offers.skipped, BAD_LISTINGS, strict=True):
        assert f"{field} " in note.split(": ", 1)[1], note
        assert len(note) < 160, note


def test_it_reads_a_verified_false_and_an_integer_too_long_for_python_as_what_they_are(scripted):
    server, client = scripted
    huge = "9" * 5000  # more digits than Python turns into an int by default
    body = _catalogue([{**GOOD_OFFER, "verified": False, "is_bid": False}, {**GOOD_OFFER, "id": 102}])
    server.replies.append((200, body.replace(b'"id": 102', b'"id": ' + huge.encode())))
    offers = client.search_offers()
    assert [(o.offer_id, o.verified, o.is_bid) for o in offers] == [("101", False, False)]
    assert offers.skipped == ["offer a 5000-digit number: id is a 5000-digit number, not a whole number"]


def test_it_reads_verification_as_vast_ai_lists_it(scripted):
    server, client = scripted
    listed = {k: v for k, v in GOOD_OFFER.items() if k != "verified"}
    offers = [{**listed, "id": 201, "verification": "verified"}, {**listed, "id": 202, "verification": "unverified"},
              {**listed, "id": 203, "verification": "deverified"}]
    server.replies.append((200, json.dumps({"offers": offers}).encode()))
    assert {o.offer_id: o.verified for o in client.search_offers()} == {"201": True, "202": False, "203": False}


@pytest.mark.parametrize("call", ["get_instance", "destroy", "list_instances"])
def test_a_refused_key_answered_as_404_is_no_machine_gone(scripted, call):
    server, client = scripted
    server.replies.append((404, b'{"success": false, "error": "auth_error", "msg": "Invalid user key"}'))
    with pytest.raises(AuthenticationFailed, match="refused the API key .*Invalid user key.*VAST_API_KEY"):
        getattr(client, call)(*(["7"] if call != "list_instances" else []))


def test_a_destroy_answered_with_success_false_is_no_destroy(scripted):
    server, client = scripted
    server.replies.append((200, b'{"success": false, "msg": "instance is locked"}'))
    with pytest.raises(MalformedResponse, match="did not destroy instance 7: instance is locked"):
        client.destroy("7")


def test_a_refused_rent_that_made_an_instance_is_an_unknown_outcome(scripted):
    # vast.ai can refuse a bid under the price after creating the instance (stopped, its disk billing).
    server, client = scripted
    server.replies.append((400, b'{"success": false, "error": "bid_too_low", "new_contract": 88}'))
    with pytest.raises(OutcomeUnknown, match="yet made instance 88: reconcile by label"):
        client.rent(RentRequest(offer_id="101", image="img", disk_gb=250, label="fleet-1", env={}))


def _rent_request(**changes):
    return RentRequest(**{"offer_id": "101", "image": "img", "disk_gb": 50, "label": "run1-box0", "env": {},
                          **changes})


def test_a_429_on_a_rent_waits_out_vasts_penalty_though_it_names_no_retry_after(scripted):
    # vast.ai's 429 carries no Retry-After: a rent within 4.5 s of the last one is refused for 12 s more.
    server, _ = scripted
    slept = []
    client = VastClient(f"http://127.0.0.1:{server.server_port}/api/v0", "key", backoff_s=0.01, sleep=slept.append)
    server.replies += [(429, b'{"detail": "API requests too frequent endpoint threshold=4.5"}'),
                       (200, json.dumps({"success": True, "new_contract": 78}).encode())]
    assert client.rent(_rent_request()) == "78"
    assert slept and slept[0] >= 12


def test_a_429_waits_at_least_the_interval_it_names(scripted):
    server, _ = scripted
    slept = []
    client = VastClient(f"http://127.0.0.1:{server.server_port}/api/v0", "key", backoff_s=0.01, sleep=slept.append)
    server.replies += [(429, b"API requests too frequent: endpoint threshold=7.5"),
                       (200, json.dumps({"offers": [GOOD_OFFER]}).encode())]
    assert len(client.search_offers()) == 1
    assert slept == [7.5]


def test_a_403_that_names_a_refused_request_is_not_a_wrong_key(scripted):
    server, client = scripted
    server.replies.append((403, json.dumps({"success": False, "error": "invalid_args", "msg":
                                            "error 403/3586: Offer 101 is not your own."}).encode()))
    with pytest.raises(RequestRefused, match="is not your own"):
        client.rent(_rent_request())
    server.replies.append((403, json.dumps({"success": False, "error": "auth_error", "msg": "bad key"}).encode()))
    with pytest.raises(AuthenticationFailed, match="VAST_API_KEY"):
        client.rent(_rent_request())


def test_a_400_invalid_args_is_a_refused_request_and_a_stale_price_an_offer_gone(scripted):
    server, client = scripted
    server.replies.append((400, json.dumps({"success": False, "error": "invalid_args",
                                            "msg": "env value too long"}).encode()))
    with pytest.raises(RequestRefused, match="env value too long"):
        client.rent(_rent_request())
    server.replies.append((400, json.dumps({"success": False, "error": "invalid_price", "msg": "stale"}).encode()))
    with pytest.raises(OfferUnavailable, match="can no longer be rented: stale"):
        client.rent(_rent_request())


@pytest.mark.parametrize("changes, words", [
    ({"env": {"FLEET_GRANT": "x" * 300}}, "FLEET_GRANT is 312 characters, over 256"),
    ({"env": {f"V{i}": "x" * 200 for i in range(200)}}, "over 32768"),
    ({"onstart": "echo hi\n" * 600}, "start script is 4800 characters, over 4096"),
    ({"label": "l" * 300}, "label or image name"),
    ({"bid_usd_per_hour": Decimal("200")}, "bid of $200/h"),
])
def test_a_rent_past_vasts_documented_limits_is_refused_before_it_is_sent(scripted, changes, words):
    server, client = scripted
    with pytest.raises(RequestRefused, match=re.escape(words)):
        client.rent(_rent_request(**changes))
    assert server.requests == []


def test_a_marketplaces_error_text_with_nul_and_control_characters_comes_out_storable(scripted):
    server, client = scripted
    server.replies.append((409, json.dumps({"msg": "no such\u0000 offer\u0007 \ud800 left"}).encode()))
    with pytest.raises(MalformedResponse) as caught:
        client.rent(RentRequest(offer_id="101", image="img", disk_gb=100, label="moe-fleet-1", env={}))
    message = str(caught.value)
    assert "HTTP 409" in message and "no such  offer" in message
    assert not any(ch in message for ch in ("\x00", "\x07", "\ud800"))  # PostgreSQL's text takes it as it is


def test_an_answer_whose_body_cannot_be_decoded_is_a_provider_error_and_a_rent_an_unknown_outcome(scripted):
    server, client = scripted
    garbled = (200, b"not gzip at all", {"Content-Encoding": "gzip"})
    server.replies.append(garbled)
    with pytest.raises(MalformedResponse, match="could not be decoded"):
        client.destroy("7")
    server.replies.append(garbled)  # a rent may have happened: reconcile by label, never rent again
    with pytest.raises(OutcomeUnknown, match="could not be decoded"):
        client.rent(RentRequest(offer_id="101", image="img", disk_gb=100, label="moe-fleet-1", env={}))
