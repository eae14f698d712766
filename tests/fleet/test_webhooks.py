"""Signed webhook alerts against real HTTP receivers on loopback."""

import base64
import hashlib
import hmac
import json
import socket
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection, transaction
from django.utils import timezone

from fleet.alerts import notify
from fleet.alerts import webhooks
from fleet.models import Alert, WebhookDelivery, WebhookEndpoint

Kind = Alert.Kind
State = WebhookDelivery.State


class Receiver:
    """A webhook receiver that answers from a script: a status code, ("sleep", seconds) or ("redirect", url).
    Once the script runs out it answers 200. Records every request it gets."""

    def __init__(self, script=()):
        self.script = list(script)
        self.requests = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver.lock:
                    receiver.requests.append({"headers": {k.lower(): v for k, v in self.headers.items()},
                                              "body": body, "path": self.path})
                    step = receiver.script.pop(0) if receiver.script else 200
                if isinstance(step, tuple) and step[0] == "sleep":
                    time.sleep(step[1])
                    step = 200
                if isinstance(step, tuple) and step[0] == "redirect":
                    self.send_response(302)
                    self.send_header("Location", step[1])
                else:
                    self.send_response(step)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made = []

    def make(*script):
        made.append(Receiver(script))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture(autouse=True)
def _fast_webhooks(settings):
    settings.WEBHOOK_TIMEOUT_S = 3.0  # answers on loopback, but on a busy 2-core machine; the timeout test sets its own
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True  # the receivers here listen on loopback
    settings.WEBHOOK_MAX_ATTEMPTS = 6
    settings.WEBHOOK_BACKOFF_BASE_S = 0.05
    settings.WEBHOOK_BACKOFF_FACTOR = 2.0
    settings.WEBHOOK_BACKOFF_MAX_S = 0.2
    settings.WEBHOOK_RETRY_SECONDS = 60


def endpoint(url, **fields):
    return notify.create_endpoint(name=fields.pop("name", "ops"), url=url, events=fields.pop("events", []),
                                  slack=fields.pop("slack", False))


def verify(secret: str, headers: dict, body: bytes) -> bool:
    """The receiver's side, written from the spec and not from fleet.alerts.webhooks."""
    key = base64.b64decode(secret[len("whsec_"):])
    signed = headers["webhook-id"].encode() + b"." + headers["webhook-timestamp"].encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(f"v1,{expected}", sig) for sig in headers["webhook-signature"].split(" "))


def only_delivery() -> WebhookDelivery:
    [delivery] = WebhookDelivery.objects.all()
    return delivery


def due_again(delivery_id):
    return WebhookDelivery.objects.get(pk=delivery_id).next_attempt_at


@pytest.mark.django_db
def test_it_signs_as_standard_webhooks(receiver):
    hook = receiver()
    ep = endpoint(hook.url)
    assert ep.secret.startswith("whsec_") and len(base64.b64decode(ep.secret[6:])) == 24
    alert = notify.raise_alert(Kind.INSTANCE_RENTED, "vast-1 rented")
    delivery = only_delivery()
    assert delivery.state == State.PENDING and delivery.message_id.startswith("msg_")

    assert notify.deliver(delivery.pk).state == State.SENT

    [request] = hook.requests
    headers, body = request["headers"], request["body"]
    assert verify(ep.secret, headers, body)
    assert not verify("whsec_" + base64.b64encode(b"x" * 24).decode(), headers, body)
    assert headers["webhook-id"] == delivery.message_id
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 5
    assert headers["content-type"] == "application/json"
    payload = json.loads(body)
    assert payload["type"] == "instance.rented"
    assert payload["data"] == {"message": "vast-1 rented", "instance": None, "alert_id": alert.pk}
    assert payload["timestamp"].startswith(str(alert.created_at.year))
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status_code) == (State.SENT, 1, 200)
    assert delivery.finished_at is not None


@pytest.mark.django_db
def test_it_retries_until_success_once_per_attempt(receiver):
    hook = receiver(500, 503)
    endpoint(hook.url)
    notify.raise_alert(Kind.RUN_FAILED, "run 7 failed")
    delivery = only_delivery()

    first = notify.deliver(delivery.pk)
    assert first.state == State.RETRYING and 0 < first.retry_in_s <= 0.05
    # Not due yet: a duplicate task sends nothing.
    assert notify.deliver(delivery.pk).state is None
    assert len(hook.requests) == 1
    assert notify.deliver(delivery.pk, now=due_again(delivery.pk)).state == State.RETRYING
    assert WebhookDelivery.objects.get(pk=delivery.pk).attempts == 2
    assert notify.deliver(delivery.pk, now=due_again(delivery.pk)).state == State.SENT
    # Sent: nothing more goes out, however often the task runs.
    assert notify.deliver(delivery.pk, now=timezone.now() + timedelta(hours=1)).state is None

    assert len(hook.requests) == 3
    assert {r["headers"]["webhook-id"] for r in hook.requests} == {delivery.message_id}
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status_code, delivery.last_error) == \
        (State.SENT, 3, 200, "")


@pytest.mark.django_db
def test_it_gives_up_after_the_maximum_attempts(receiver, settings):
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    hook = receiver(500, 500, 500)
    endpoint(hook.url)
    notify.raise_alert(Kind.RUN_FAILED, "run 7 failed")
    delivery = only_delivery()
    notify.deliver(delivery.pk)
    assert notify.deliver(delivery.pk, now=due_again(delivery.pk)).state == State.FAILED
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.next_attempt_at) == (State.FAILED, 2, None)
    assert "gave up after 2 attempts" in delivery.last_error and "HTTP 500" in delivery.last_error
    assert len(hook.requests) == 2


@pytest.mark.django_db
def test_it_disables_the_endpoint_on_410(receiver):
    hook = receiver(410)
    ep = endpoint(hook.url)
    notify.raise_alert(Kind.INSTANCE_DESTROYED, "gone")
    notify.raise_alert(Kind.INSTANCE_DESTROYED, "gone again")
    first, second = WebhookDelivery.objects.order_by("id")

    assert notify.deliver(first.pk).state == State.FAILED
    ep.refresh_from_db()
    assert not ep.enabled and "410" in ep.disabled_reason
    first.refresh_from_db()
    assert first.last_status_code == 410 and first.attempts == 1
    # The other waiting delivery fails without an attempt, and new alerts no longer go there.
    assert notify.deliver(second.pk).state is None
    second.refresh_from_db()
    assert (second.state, second.attempts, second.last_error) == (State.FAILED, 0, "endpoint disabled")
    notify.raise_alert(Kind.INSTANCE_DESTROYED, "after")
    assert WebhookDelivery.objects.count() == 2
    assert len(hook.requests) == 1


@pytest.mark.django_db
def test_it_does_not_follow_a_redirect(receiver):
    elsewhere = receiver()
    hook = receiver(("redirect", elsewhere.url))
    endpoint(hook.url)
    notify.raise_alert(Kind.PROBE_FAILING, "3 failed probes")
    delivery = only_delivery()
    assert notify.deliver(delivery.pk).state == State.RETRYING
    delivery.refresh_from_db()
    assert delivery.last_status_code == 302 and "redirect not followed" in delivery.last_error
    assert len(hook.requests) == 1 and elsewhere.requests == []


@pytest.mark.django_db
def test_it_counts_timeouts_and_dead_receivers_as_failures(receiver, settings):
    settings.WEBHOOK_TIMEOUT_S = 0.3
    slow = receiver(("sleep", 1.0))
    dead = receiver()
    dead.close()
    endpoint(slow.url, name="slow")
    endpoint(dead.url, name="dead")
    notify.raise_alert(Kind.SPEND_CAP_HIT, "spend $14.20/h > cap $12/h")
    started = time.monotonic()
    states = {d.endpoint.name: notify.deliver(d.pk).state for d in WebhookDelivery.objects.select_related("endpoint")}
    assert time.monotonic() - started < 1.0
    assert states == {"slow": State.RETRYING, "dead": State.RETRYING}
    errors = dict(WebhookDelivery.objects.values_list("endpoint__name", "last_error"))
    assert "timed out" in errors["slow"]
    assert "ConnectError" in errors["dead"]
    assert WebhookDelivery.objects.filter(last_status_code=None).count() == 2


@pytest.mark.django_db
def test_it_stores_the_alert_when_there_are_no_endpoints():
    alert = notify.raise_alert(Kind.RUN_FINISHED, "run 3 finished")
    assert Alert.objects.get().pk == alert.pk and alert.message == "run 3 finished"
    assert WebhookDelivery.objects.count() == 0


@pytest.mark.django_db
def test_it_delivers_only_the_kinds_an_endpoint_wants(receiver, django_capture_on_commit_callbacks):
    hook = receiver()
    rented_only = endpoint(hook.url, name="rented", events=[Kind.INSTANCE_RENTED])
    everything = endpoint(hook.url, name="all")
    off = endpoint(hook.url, name="off")
    notify.set_enabled(off, False)

    with django_capture_on_commit_callbacks() as queued:
        destroyed = notify.raise_alert(Kind.INSTANCE_DESTROYED, "destroyed")
        rented = notify.raise_alert(Kind.INSTANCE_RENTED, "rented")
    assert len(queued) == 3  # one task per delivery, enqueued after commit
    assert set(destroyed.deliveries.values_list("endpoint", flat=True)) == {everything.pk}
    assert set(rented.deliveries.values_list("endpoint", flat=True)) == {rented_only.pk, everything.pk}


@pytest.mark.django_db
def test_it_sends_a_slack_compatible_body(receiver):
    hook = receiver()
    ep = endpoint(hook.url, slack=True)
    notify.raise_alert(Kind.INSTANCE_REAPED, "age 12h03m > max 12h")
    notify.deliver(only_delivery().pk)
    [request] = hook.requests
    assert json.loads(request["body"]) == {"text": "[instance.reaped] age 12h03m &gt; max 12h"}  # Slack shows ">"
    assert verify(ep.secret, request["headers"], request["body"])


@pytest.mark.django_db
def test_a_slack_body_shows_a_boxs_words_literally(receiver):
    # Slack reads <!channel> as a ping of everyone and <url|label> as a disguised link; a box's words may do neither.
    hook = receiver()
    endpoint(hook.url, slack=True)
    notify.raise_alert(Kind.RUN_FAILED, "trainer: <!channel> log in at <https://evil.example|vast.ai> & retry")
    notify.deliver(only_delivery().pk)
    [request] = hook.requests
    assert json.loads(request["body"])["text"] == ("[run.failed] trainer: &lt;!channel&gt; log in at "
                                                   "&lt;https://evil.example|vast.ai&gt; &amp; retry")


def test_a_url_with_a_control_character_is_refused_and_never_crashes_an_attempt():
    url = "https://hooks.example.com/hook\x01"
    assert webhooks.url_refusal(url, allow_private=False) == "a URL holds no spaces or control characters"
    attempt = webhooks.post(url, {}, b"{}", timeout_s=1, allow_private=True)
    assert attempt.status_code is None and attempt.error


@pytest.mark.django_db(transaction=True)
def test_it_sends_an_attempt_once_when_two_workers_race(receiver):
    hook = receiver(("sleep", 0.2))
    endpoint(hook.url)
    notify.raise_alert(Kind.RUN_FAILED, "run 9 failed")
    delivery = only_delivery()
    barrier = threading.Barrier(2)
    results = []

    def work():
        barrier.wait()
        try:
            results.append(notify.deliver(delivery.pk).state)
        finally:
            connection.close()

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results, key=str) == [None, State.SENT]
    assert len(hook.requests) == 1
    assert WebhookDelivery.objects.get().attempts == 1


@pytest.mark.django_db
def test_it_picks_up_deliveries_whose_task_was_lost(receiver):
    hook = receiver()
    endpoint(hook.url)
    now = timezone.now()
    notify.raise_alert(Kind.RUN_FAILED, "old", now=now - timedelta(minutes=5))
    notify.raise_alert(Kind.RUN_FAILED, "fresh", now=now)
    notify.raise_alert(Kind.RUN_FAILED, "worker died", now=now - timedelta(minutes=5))
    old, _fresh, died = WebhookDelivery.objects.order_by("id")
    WebhookDelivery.objects.filter(pk=died.pk).update(state=State.SENDING, attempts=1,
                                                      next_attempt_at=now - timedelta(seconds=1))

    assert sorted(notify.due_deliveries(now=now)) == sorted([old.pk, died.pk])
    died.refresh_from_db()
    assert died.state == State.RETRYING and "no result" in died.last_error
    assert notify.deliver(died.pk).state == State.SENT
    assert WebhookDelivery.objects.get(pk=died.pk).attempts == 2


def test_it_backs_off_exponentially_with_jitter_and_a_cap():
    def delay(attempts, rand):
        return webhooks.backoff_s(attempts, base_s=10, factor=2, max_s=300, rand=lambda: rand)

    assert [delay(n, 1.0) for n in (1, 2, 3, 4)] == [10, 20, 40, 80]
    assert [delay(n, 0.0) for n in (1, 2, 3)] == [5, 10, 20]
    assert delay(10, 1.0) == 300 and delay(10, 0.0) == 150


def test_it_decides_from_the_status_code():
    assert webhooks.decide(204, 1, 6) == webhooks.SENT
    assert webhooks.decide(410, 1, 6) == webhooks.GONE
    assert webhooks.decide(302, 1, 6) == webhooks.RETRY
    assert webhooks.decide(None, 5, 6) == webhooks.RETRY
    assert webhooks.decide(500, 6, 6) == webhooks.FAILED


def test_it_retries_through_a_real_worker(receiver, celery_worker):
    hook = receiver(500, 500)
    endpoint(hook.url)
    with transaction.atomic():
        notify.raise_alert(Kind.RUN_FAILED, "run 11 failed")
        assert hook.requests == []  # nothing leaves before the commit
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and WebhookDelivery.objects.get().state != State.SENT:
        time.sleep(0.05)
    delivery = WebhookDelivery.objects.get()
    assert (delivery.state, delivery.attempts) == (State.SENT, 3)
    assert [r["headers"]["webhook-id"] for r in hook.requests] == [delivery.message_id] * 3
    assert len({r["headers"]["webhook-signature"] for r in hook.requests}) >= 1
    assert WebhookEndpoint.objects.get().enabled


# -- where a webhook may go, and for how long ---------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9/hook", "http://localhost/hook", "http://169.254.169.254/latest/meta-data/",
    "http://10.1.2.3/hook", "http://192.168.0.10:8080/hook", "http://[::1]/hook", "http://[::ffff:127.0.0.1]/hook",
    "http://[::ffff:a9fe:a9fe]/", "https://0.0.0.0/hook",
])
def test_it_refuses_to_save_an_endpoint_on_an_address_the_guard_refuses(url, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    with pytest.raises(ValueError, match="not allowed"):
        endpoint(url)
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.django_db
def test_it_never_allows_a_metadata_address(settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True  # a lab network: loopback and private, but never metadata
    with pytest.raises(ValueError, match="cloud metadata"):
        endpoint("http://169.254.169.254/latest/meta-data/")


@pytest.mark.django_db
def test_it_checks_the_address_again_at_every_attempt(receiver, settings):
    hook = receiver(200)
    saved = endpoint(hook.url)  # saved while a lab setting allowed loopback
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    notify.raise_alert(Kind.RUN_FAILED, "run 7 failed")
    delivery = WebhookDelivery.objects.get(endpoint=saved)
    assert notify.deliver(delivery.pk).state == State.RETRYING
    delivery.refresh_from_db()
    assert delivery.last_error.startswith("refused: 127.0.0.1 is a loopback address")
    assert hook.requests == []  # nothing was sent


@pytest.mark.django_db
def test_a_receiver_that_drips_holds_an_attempt_no_longer_than_its_deadline():
    # Headers one byte every 50 ms: no single read waits long, so only a deadline on the whole attempt ends it.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop = threading.Event()

    def drip():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
                if stop.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.05)

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    started = time.monotonic()
    attempt = webhooks.post(f"http://127.0.0.1:{listener.getsockname()[1]}/hook", {}, b"{}", timeout_s=0.5,
                            allow_private=True)
    elapsed = time.monotonic() - started
    stop.set()
    listener.close()
    assert attempt.status_code is None and attempt.error.startswith("timed out")
    assert elapsed < 1.0


def test_it_shows_host_and_port_only():
    assert webhooks.shown_host("https://user:s3cret@hooks.example.com:8443/T000/B000/XYZ?token=1") == \
        "hooks.example.com:8443"
    assert webhooks.shown_host("https://hooks.slack.com/services/T0/B0/secret") == "hooks.slack.com"
    assert webhooks.shown_host("http://[2001:db8::1]:8080/x") == "[2001:db8::1]:8080"
