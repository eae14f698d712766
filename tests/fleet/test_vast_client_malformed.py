"""What the vast.ai client does with answers that are not what the API documents, over a real local server."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleet.providers.errors import MalformedResponse, OutcomeUnknown, ProviderUnavailable
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
    replies: list = []  # (status, body bytes) answered in order

    def _answer(self):
        self.server.requests.append((self.command, self.path))
        status, body = self.server.replies.pop(0)
        self.send_response(status)
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


def test_it_rejects_a_rent_answer_without_an_instance_id(scripted):
    server, client = scripted
    server.replies.append((200, b'{"success": true}'))
    with pytest.raises(MalformedResponse, match="no instance id"):
        client.rent(RentRequest(offer_id="101", image="img", disk_gb=250, label="fleet-1", env={}))


def test_it_rejects_a_charge_line_without_times(scripted):
    server, client = scripted
    server.replies.append((200, b'{"charges": [{"instance_id": 1, "type": "gpu", "amount": 1.0, "quantity": 1}]}'))
    with pytest.raises(MalformedResponse, match="charge line"):
        client.charges()


def test_it_keeps_the_key_out_of_its_repr():
    client = VastClient("http://127.0.0.1:9/api/v0", "secret-key-value")
    assert "secret-key-value" not in repr(client)
