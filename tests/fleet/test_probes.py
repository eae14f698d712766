"""Probes of serving boxes' /v1/models against real HTTP servers on loopback: healthy, slow, 500, dead, redirecting
to a private address, answering the wrong shape; the address guard; failures counted, reset and alerted once."""

import asyncio
import json
import socket
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from fleet import addresses
from fleet import tasks
from fleet.inference import probes
from fleet.models import Alert, InferenceModel, Instance, ProbeResult

pytestmark = pytest.mark.django_db
TIMEOUT_S = 0.5
MODEL = "Qwen/Qwen3-30B-A3B"
MODELS_LIST = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "vllm"}]}).encode()


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # a round opens many connections at once; the default backlog of 5 drops SYNs
    daemon_threads = True


class Endpoint:
    """One HTTP server on 127.0.0.1 that answers every request one way and counts what reached it."""

    def __init__(self, behaviour: str):
        endpoint = self
        self.behaviour, self.hits = behaviour, []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                endpoint.hits.append(self.path)
                status, headers, body = endpoint.answer()
                if status is None:
                    return
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except BrokenPipeError:
                    pass  # the probe gave up first, as it should

            def log_message(self, *args):
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self):
        if self.behaviour == "healthy":
            return 200, {"Content-Type": "application/json"}, MODELS_LIST
        if self.behaviour == "slow":
            time.sleep(TIMEOUT_S * 3)
            return 200, {"Content-Type": "application/json"}, MODELS_LIST
        if self.behaviour == "error":
            return 500, {}, b"Internal Server Error"
        if self.behaviour == "redirect":
            return 302, {"Location": "http://169.254.169.254/latest/meta-data/"}, b""
        if self.behaviour == "wrong-shape":
            return 200, {"Content-Type": "application/json"}, b'{"status": "ok"}'
        if self.behaviour == "other-model":
            return 200, {}, json.dumps({"object": "list", "data": [{"id": "some/other"}]}).encode()
        raise AssertionError(self.behaviour)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def endpoints():
    started = {b: Endpoint(b) for b in ("healthy", "slow", "error", "redirect", "wrong-shape", "other-model")}
    yield started
    for endpoint in started.values():
        endpoint.stop()


@pytest.fixture
def dead_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the block ends: nothing listens there


@pytest.fixture(autouse=True)
def probe_settings(settings):
    settings.PROBE_TIMEOUT_S = TIMEOUT_S
    settings.PROBE_CONCURRENCY = 50
    settings.PROBE_ALLOW_PRIVATE_ADDRESSES = True
    settings.PROBE_STARTUP_GRACE_S = 600
    return settings


@pytest.fixture
def model():
    return InferenceModel.objects.create(name=MODEL, image="vllm/vllm-openai:v0.9.2", port=8000)


def _box(model, port, *, ip="127.0.0.1", running_for=timedelta(hours=1), key=None, **fields) -> Instance:
    now = timezone.now()
    fields.setdefault("serving_model", model)
    return Instance.objects.create(
        provider="vast", idempotency_key=key or f"box-{port}-{ip}-{time.monotonic_ns()}", label=f"serve-{port}",
        state=Instance.State.RUNNING, purpose="serving", offer_id="1", gpu_name="H100 SXM", image=model.image,
        disk_gb=100, requested_at=now - running_for, running_at=now - running_for,
        public_ip=ip, ports={"8000/tcp": port, "22/tcp": 2222}, **fields)


def _last(box) -> ProbeResult:
    return ProbeResult.objects.filter(instance=box).first()


def test_it_records_a_healthy_box(endpoints, model):
    box = _box(model, endpoints["healthy"].port, consecutive_probe_failures=2)
    report = probes.probe_serving_instances()
    box.refresh_from_db()
    assert report.ok == 1 and report.failed == 0
    assert box.consecutive_probe_failures == 0 and box.models_served == [MODEL]
    assert box.last_probe_at is not None and box.last_process_at == box.last_probe_at
    assert 0 < box.last_probe_latency_ms < TIMEOUT_S * 1000
    result = _last(box)
    assert result.ok and result.status_code == 200 and result.models_served == [MODEL] and result.error == ""
    assert endpoints["healthy"].hits[-1] == "/v1/models"


def test_it_fails_slow_500_dead_redirecting_and_wrong_shaped_boxes_in_one_timeout(endpoints, model, dead_port):
    boxes = {name: _box(model, endpoints[name].port)
             for name in ("slow", "error", "redirect", "wrong-shape", "other-model")}
    boxes["dead"] = _box(model, dead_port)
    started = time.monotonic()
    report = probes.probe_serving_instances()
    assert time.monotonic() - started < TIMEOUT_S + 1
    assert report.failed == 6 and report.ok == 0
    errors = {name: _last(box).error for name, box in boxes.items()}
    assert errors["slow"] == f"timed out after {TIMEOUT_S:g} s"
    assert errors["error"] == "HTTP 500" and _last(boxes["error"]).status_code == 500
    assert errors["redirect"].startswith("HTTP 302 redirected to http://169.254.169.254/latest/meta-data/")
    assert "not an OpenAI models list" in errors["wrong-shape"]
    assert errors["other-model"] == f"serves some/other but not {MODEL}"
    assert errors["dead"].startswith("ConnectError")
    for box in boxes.values():
        box.refresh_from_db()
        assert box.consecutive_probe_failures == 1 and box.last_process_at is None and box.last_probe_at


def test_it_counts_failures_alerts_once_at_three_and_resets_on_success(endpoints, model, dead_port):
    box = _box(model, dead_port)
    counts = []
    for _ in range(4):
        probes.probe_serving_instances()
        box.refresh_from_db()
        counts.append(box.consecutive_probe_failures)
    assert counts == [1, 2, 3, 4]
    alerts = Alert.objects.filter(kind=Alert.Kind.PROBE_FAILING, instance=box)
    assert alerts.count() == 1 and "3 failed probes of /v1/models" in alerts.get().message
    assert ProbeResult.objects.filter(instance=box, ok=False).count() == 4

    Instance.objects.filter(pk=box.pk).update(ports={"8000/tcp": endpoints["healthy"].port})
    probes.probe_serving_instances()
    box.refresh_from_db()
    assert box.consecutive_probe_failures == 0 and box.last_process_at is not None


def test_it_alerts_again_when_a_box_fails_again_after_recovering(endpoints, model, dead_port):
    box = _box(model, dead_port, consecutive_probe_failures=2)
    probes.probe_serving_instances()
    Instance.objects.filter(pk=box.pk).update(ports={"8000/tcp": endpoints["healthy"].port})
    probes.probe_serving_instances()
    Instance.objects.filter(pk=box.pk).update(ports={"8000/tcp": dead_port})
    for _ in range(3):
        probes.probe_serving_instances()
    assert Alert.objects.filter(kind=Alert.Kind.PROBE_FAILING, instance=box).count() == 2


@pytest.mark.parametrize("address", ["127.0.0.1", "127.8.8.8", "::1", "::ffff:127.0.0.1"])
def test_it_refuses_loopback_without_sending_a_request(endpoints, model, probe_settings, address):
    probe_settings.PROBE_ALLOW_PRIVATE_ADDRESSES = False
    healthy = endpoints["healthy"]
    seen = len(healthy.hits)
    box = _box(model, healthy.port, ip=address)
    report = probes.probe_serving_instances()
    time.sleep(0.05)
    assert len(healthy.hits) == seen  # nothing reached the server
    result = _last(box)
    assert report.refused == 1 and not result.ok and result.status_code is None and result.latency_ms is None
    assert result.error.startswith("refused: ") and "loopback" in result.error
    box.refresh_from_db()
    assert box.consecutive_probe_failures == 1


@pytest.mark.parametrize("address, words", [
    ("10.1.2.3", "private"),
    ("192.168.0.10", "private"),
    ("172.16.5.4", "private"),
    ("100.64.1.1", "not a public address"),  # carrier-grade NAT
    ("169.254.169.254", "cloud metadata"),
    ("169.254.10.10", "link-local"),
    ("fd00:ec2::254", "cloud metadata"),
    ("168.63.129.16", "cloud metadata"),  # Azure's WireServer: public, yet the host's own agent
    ("fe80::1", "link-local"),
    ("fc00::5", "private"),
    ("0.0.0.0", "unspecified"),  # noqa: S104 - an address refused, not one bound
    ("::", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("240.0.0.1", "reserved"),
    ("::ffff:10.0.0.1", "private"),
    ("64:ff9b::a9fe:a9fe", "cloud metadata"),  # NAT64 of 169.254.169.254
    ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
    ("fec0::1", "site-local"),  # deprecated, yet not private to every Python
    ("::ffff:0:a00:1", "private"),  # IPv4-translated 10.0.0.1
    ("203.0.113.7", "private"),  # documentation range: never routed
    ("localhost", "not a literal IP address"),
    ("metadata.google.internal", "not a literal IP address"),
])
def test_it_refuses_non_public_addresses(address, words):
    assert words in addresses.address_refusal(address, allow_private=False)


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700:4700::1111", "1.1.1.1"])
def test_it_allows_public_addresses(address):
    assert addresses.address_refusal(address, allow_private=False) == ""


def test_it_refuses_metadata_unspecified_and_multicast_even_when_private_addresses_are_allowed():
    for address in ("169.254.169.254", "fd00:ec2::254", "0.0.0.0", "239.1.1.1",  # noqa: S104 - refused, not bound
                    # the metadata address carried in IPv6: IPv4-compatible, -translated, local-use NAT64
                    "::a9fe:a9fe", "::ffff:0:a9fe:a9fe", "64:ff9b:1::a9fe:a9fe"):
        assert addresses.address_refusal(address, allow_private=True), address
    for address in ("127.0.0.1", "10.0.0.2", "::1"):
        assert addresses.address_refusal(address, allow_private=True) == ""


def test_it_probes_only_the_port_mapped_to_the_models_container_port(endpoints, model):
    healthy = endpoints["healthy"]
    seen = len(healthy.hits)
    box = _box(model, healthy.port)
    Instance.objects.filter(pk=box.pk).update(ports={"22/tcp": healthy.port})  # only ssh is mapped
    hostname = _box(model, healthy.port, ip="localhost")
    probes.probe_serving_instances()
    assert len(healthy.hits) == seen
    assert _last(box).error == "no public port mapped to container port 8000/tcp"
    assert _last(hostname).error.startswith("refused: 'localhost' is not a literal IP address")
    assert probes.probe_url("2606:4700::1", {"8000/tcp": 41234}, 8000, allow_private=False) == (
        "http://[2606:4700::1]:41234/v1/models", "")


def test_it_records_but_does_not_count_failures_while_a_new_box_loads_its_model(model, dead_port):
    starting = _box(model, dead_port, running_for=timedelta(minutes=2))
    answered_once = _box(model, dead_port, running_for=timedelta(minutes=2), last_process_at=timezone.now())
    probes.probe_serving_instances()
    starting.refresh_from_db()
    answered_once.refresh_from_db()
    assert starting.consecutive_probe_failures == 0 and _last(starting).error.startswith("(starting, not counted)")
    assert answered_once.consecutive_probe_failures == 1


def test_it_probes_only_running_serving_boxes(endpoints, model):
    healthy = endpoints["healthy"]
    training = _box(model, healthy.port, serving_model=None)
    Instance.objects.filter(pk=training.pk).update(purpose="training")
    stopping = _box(model, healthy.port)
    Instance.objects.filter(pk=stopping.pk).update(state=Instance.State.STOPPING)
    assert probes.probe_serving_instances().probed == 0


def test_it_writes_a_round_in_a_constant_number_of_queries(endpoints, model, dead_port, probe_settings,
                                                            django_assert_max_num_queries):
    # This test counts queries, not seconds: 20 answers from one in-process server may take over 0.5 s on a loaded
    # two-core machine, and a healthy box that timed out would be a false failure here.
    probe_settings.PROBE_TIMEOUT_S = 10
    for i in range(40):
        _box(model, endpoints["healthy"].port if i % 2 else dead_port)
    # lock, read, results, two updates, unlock: the same for 40 boxes as for 4,000
    with django_assert_max_num_queries(8):
        report = probes.probe_serving_instances()
    assert report.probed == 40 and report.ok == 20 and report.failed == 20 and not report.alerted
    assert ProbeResult.objects.count() == 40


def test_it_skips_a_round_while_another_one_holds_the_lock(endpoints, model, settings):
    import psycopg

    _box(model, endpoints["healthy"].port)
    db = settings.DATABASES["default"]
    with psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], password=db["PASSWORD"] or None,
                         dbname=db["NAME"], autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [probes._LOCK_KEY])
        assert probes.probe_serving_instances().skipped
        other.execute("SELECT pg_advisory_unlock(%s)", [probes._LOCK_KEY])  # a closed session frees it only later
    assert probes.probe_serving_instances().ok == 1


def test_it_runs_as_a_celery_task(endpoints, model):
    _box(model, endpoints["healthy"].port)
    result = tasks.probe_serving_instances.apply().get()
    assert result["probed"] == 1 and result["ok"] == 1 and result["skipped"] is False


def test_it_writes_each_box_its_own_figures_in_the_bulk_writes(endpoints, model, dead_port):
    healthy = [_box(model, endpoints["healthy"].port, consecutive_probe_failures=2) for _ in range(3)]
    dead = [_box(model, dead_port, consecutive_probe_failures=n) for n in (0, 1, 5)]
    probes.probe_serving_instances()
    for box in healthy + dead:
        box.refresh_from_db()
        result = _last(box)
        assert box.last_probe_latency_ms == result.latency_ms and box.last_probe_at == result.at
        assert result.instance_id == box.pk
    assert [box.consecutive_probe_failures for box in healthy + dead] == [0, 0, 0, 1, 2, 6]
    assert all(box.models_served == [MODEL] and box.last_process_at == box.last_probe_at for box in healthy)
    assert all(box.models_served == [] and box.last_process_at is None for box in dead)
    assert [_last(box).models_served for box in healthy] == [[MODEL]] * 3


def test_it_ends_every_probe_within_the_timeout_of_the_rounds_start_however_late_the_loop_opens_them(endpoints):
    url = f"http://127.0.0.1:{endpoints['slow'].port}/v1/models"
    targets = [probes.Target(i, url) for i in range(20)]

    async def on_a_busy_worker():
        # the event loop is held up before it opens any connection, as opening hundreds of them holds it up
        asyncio.get_running_loop().call_soon(time.sleep, TIMEOUT_S)
        return await probes.probe_targets(targets, timeout_s=TIMEOUT_S, concurrency=len(targets))

    started = time.monotonic()
    outcomes = asyncio.run(on_a_busy_worker())
    assert time.monotonic() - started < TIMEOUT_S * 1.6
    assert [o.error for o in outcomes] == [f"timed out after {TIMEOUT_S:g} s"] * len(targets)


def test_it_gives_a_probe_that_waited_for_a_slot_its_whole_timeout(endpoints):
    url = f"http://127.0.0.1:{endpoints['slow'].port}/v1/models"
    started = time.monotonic()
    outcomes = asyncio.run(probes.probe_targets([probes.Target(1, url), probes.Target(2, url)], timeout_s=TIMEOUT_S,
                                                concurrency=1))
    assert time.monotonic() - started >= 2 * TIMEOUT_S
    assert [o.error for o in outcomes] == [f"timed out after {TIMEOUT_S:g} s"] * 2
    assert all(o.latency_ms >= TIMEOUT_S * 1000 * 0.9 for o in outcomes), [o.latency_ms for o in outcomes]
