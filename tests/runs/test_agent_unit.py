"""The on-box agent's parts, against a real local HTTP server standing in for the dashboard."""

import json
import sys
import threading
import time

import pytest

from runs.api import PointIn
from training.agent.dashboard import Api, Refused
from training.agent.exit_codes import Exit
from training.agent.gpu import gpu_status
from training.agent.heartbeat import Heartbeat
from training.agent.install_probe import probe
from training.agent.metrics import forward_metrics, to_point
from training.agent.retry import JITTER, backoff_s, retried
from training.agent.self_stop import stop_machine
from training.agent.uploads import Uploader
from tests.http_servers import QuietHandler, serving


class _Dashboard(QuietHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.posts.append((self.path, body, self.headers["Authorization"]))
        self.answer(self.server.status, self.server.answers.get(self.path.rsplit("/", 1)[-1], {}))


@pytest.fixture
def dashboard():
    answers = {"metrics": {"stored": 0}, "heartbeat": {"command": "continue"}}
    with serving(_Dashboard, posts=[], answers=answers, status=200) as server:
        yield server


def _api(server):
    return Api(f"http://127.0.0.1:{server.server_port}/api/agent/v1/", "run_token", attempts=1)


def test_it_maps_every_trainer_metric_onto_the_api():
    record = {"phase": 1, "phase_name": "sft", "step": 7, "time": time.time(), "loss": 1.5, "lr": 1e-4,
              "step_s": 2.0, "tokens_per_s": 8192.0, "grad_norm_routed": 0.4, "grad_norm_attention": 0.3,
              "grad_norm_linear_attention": 0.2, "grad_norm_shared_expert": 0.1,
              "grad_norm_total": 0.5, "routed_b_norm": 2.0, "routed_b_zero": 0, "routed_b_count": 96,
              "gpu_mem_gib": 70.0, "gpu_peak_gib": 80.0, "kernel_path": "triton", "router_max_mean": 1.5,
              "router_idle_experts": 1, "router_load": [[3, 0], [1, 2]],
              # each phase kind's own figures and the held-out ones (one record holds them all here)
              "rewards_chosen": -0.5, "rewards_rejected": -1.5, "rewards_accuracy": 0.75, "rewards_margin": 1.0,
              "kl": 0.01, "reward_mean": 0.4, "reward_std": 0.2, "completion_length": 40.0, "zero_spread_groups": 0.25,
              "eval_loss": 1.4, "eval_perplexity": 4.06, "eval_rewards_chosen": -0.4, "eval_rewards_rejected": -1.0,
              "eval_rewards_accuracy": 0.5, "eval_rewards_margin": 0.6, "eval_reward_mean": 0.3,
              "eval_reward_std": 0.1, "eval_s": 3.0}
    point = to_point(record)
    assert set(point) == set(PointIn.model_fields)  # nothing the dashboard stores is left unsent
    assert point["phase"] == 1 and point["step_s"] == 2.0 and point["gpu_mem_gib"] == 70.0
    PointIn(**point)


def test_it_keeps_a_half_written_line_for_the_next_round(dashboard, tmp_path):
    path = tmp_path / "metrics.jsonl"
    line = {"phase": 0, "step": 1, "time": 1_800_000_000.0, "loss": 2.0}
    path.write_text(json.dumps(line) + "\n" + '{"phase": 0, "st')
    position = forward_metrics(_api(dashboard), path, 0, max_points=100)
    assert [body["points"][0]["step"] for _, body, _ in dashboard.posts] == [1]
    with open(path, "a") as f:
        f.write('ep": 2, "time": 1800000001.0}\n')
    forward_metrics(_api(dashboard), path, position, max_points=100)
    assert [body["points"][0]["step"] for _, body, _ in dashboard.posts] == [1, 2]
    assert dashboard.posts[0][2] == "Bearer run_token"


def test_it_keeps_unsent_metrics_when_the_dashboard_does_not_answer(dashboard, tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"phase": 0, "step": step, "time": 1_800_000_000.0 + step, "loss": 2.0} for step in (1, 2, 3)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    down = Api("http://127.0.0.1:9/api/agent/v1/", "run_token", timeout_s=0.2, attempts=1)
    assert forward_metrics(down, path, 0, max_points=2) == 0  # the agent goes on; nothing is lost
    forward_metrics(_api(dashboard), path, 0, max_points=2)
    assert [[p["step"] for p in body["points"]] for _, body, _ in dashboard.posts] == [[1, 2], [3]]


def test_it_skips_a_malformed_line_and_a_refused_batch_without_stopping(dashboard, tmp_path):
    path = tmp_path / "metrics.jsonl"
    good = json.dumps({"phase": 0, "step": 4, "time": 1_800_000_000.0, "loss": 2.0})
    path.write_text('not json\n[1, 2]\n{"loss": 1.0}\n' + good + "\n")
    assert forward_metrics(_api(dashboard), path, 0, max_points=10) == path.stat().st_size
    assert [[p["step"] for p in body["points"]] for _, body, _ in dashboard.posts] == [[4]]
    dashboard.status = 400  # the dashboard refuses what was sent: dropped, said, and the next lines still go
    with open(path, "a") as f:
        f.write(json.dumps({"phase": 0, "step": 5, "time": 1_800_000_001.0}) + "\n")
    assert forward_metrics(_api(dashboard), path, 0, max_points=10) == path.stat().st_size


def test_a_diverged_steps_nan_and_infinity_go_as_not_measured_and_the_forwarding_goes_on(dashboard, tmp_path):
    """The trainer writes the step whose loss went NaN before it stops, and an infinite gradient norm as it is: JSON
    cannot carry them and the dashboard refuses them, so they go as figures not measured, the rest of the step kept."""
    path = tmp_path / "metrics.jsonl"
    now = time.time()
    lines = [{"phase": 0, "step": 1, "time": now - 2, "loss": 2.0, "step_s": 1.5},
             {"phase": 0, "step": 2, "time": now - 1, "loss": float("nan"), "grad_norm_total": float("inf"),
              "step_s": 1.6}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))  # json writes NaN and Infinity
    assert forward_metrics(_api(dashboard), path, 0, max_points=10) == path.stat().st_size
    (_, body, _), = dashboard.posts
    first, second = body["points"]
    assert first["loss"] == 2.0 and second["step_s"] == 1.6
    assert "loss" not in second and "grad_norm_total" not in second
    PointIn(**second)  # what the dashboard takes


class _Picky(_Dashboard):
    """Refuses, as the dashboard does a malformed point, any batch holding a point of a refused step."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.posts.append(body)
        if any(p["step"] in self.server.refused for p in body["points"]):
            self.answer(422, {"detail": "a point out of its bounds"})
        else:
            self.server.stored += [p["step"] for p in body["points"]]
            self.answer(200, {"stored": len(body["points"])})


def test_of_a_refused_batch_only_the_points_the_dashboard_refuses_are_lost(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"phase": 0, "step": step, "time": 1_800_000_000.0 + step}) + "\n"
                            for step in range(1, 12)))
    with serving(_Picky, posts=[], refused={4, 9}, stored=[]) as server:
        assert forward_metrics(_api(server), path, 0, max_points=100) == path.stat().st_size
        assert sorted(server.stored) == [1, 2, 3, 5, 6, 7, 8, 10, 11]
        assert len(server.posts) < 20  # halves, not every point again and again


def test_it_stops_when_its_credentials_are_not_renewed(tmp_path):
    dead = Api("http://127.0.0.1:9/api/agent/v1/", "run_token", timeout_s=0.2, attempts=1)
    beat = Heartbeat(dead, interval_s=0.01, window_s=0.0)
    beat.beat()
    assert beat.stop.is_set() and beat.self_stop
    assert "dead-man switch" in beat.stop_reason


def test_it_stops_when_the_dashboard_says_so(dashboard):
    dashboard.answers["heartbeat"] = {"command": "stop"}
    beat = Heartbeat(_api(dashboard), interval_s=0.01, window_s=3600)
    beat.beat()
    assert beat.stop.is_set() and not beat.self_stop


def test_it_stops_its_machine_when_the_dashboard_says_nothing_watches_it(dashboard):
    dashboard.answers["heartbeat"] = {"command": "stop_machine", "reason": "the supervisor is silent"}
    beat = Heartbeat(_api(dashboard), interval_s=0.01, window_s=3600)
    beat.beat()
    assert beat.stop.is_set() and beat.self_stop and "the supervisor is silent" in beat.stop_reason


def test_it_stops_its_machine_when_its_token_is_refused(dashboard):
    dashboard.status = 401
    beat = Heartbeat(_api(dashboard), interval_s=0.01, window_s=3600)
    beat.beat()
    assert beat.stop.is_set() and beat.self_stop and "no longer accepts" in beat.stop_reason


@pytest.mark.parametrize("answer", [{}, {"command": None}, {"command": "reboot"}, [], "ok", {"upload": "x"}])
def test_an_odd_answer_neither_stops_the_box_nor_ends_its_heartbeat(dashboard, answer):
    dashboard.answers["heartbeat"] = answer
    beat = Heartbeat(_api(dashboard), interval_s=0.01, window_s=3600)
    beat.start()
    time.sleep(0.1)
    assert beat.is_alive() and not beat.stop.is_set()
    beat.finish()


@pytest.mark.parametrize("printed, expected", [
    ("[N/A], [N/A]\n", {"gpu_ok": True}),
    ("97, 81000\n[N/A], 1024\n", {"gpu_ok": True, "gpu_util_percent": 97.0, "gpu_mem_gib": 80.1}),
    ("[Not Supported], nan\n", {"gpu_ok": True}),
    ("", {"gpu_ok": False}),
])
def test_it_reads_what_nvidia_smi_can_say(tmp_path, monkeypatch, printed, expected):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\nprintf '{printed}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    status = gpu_status()
    assert set(status) == set(expected)
    for key, value in expected.items():
        assert status[key] == pytest.approx(value, abs=0.05)


def test_it_stops_its_own_runpod_pod_with_the_pods_key(monkeypatch):
    from tests.fleet.runpod_server import RUNPOD_KEY, FakeRunPod

    fake = FakeRunPod(boot_polls=None).start()
    try:
        pod = fake.deploy({"gpuTypeId": "NVIDIA H200", "gpuCount": 1, "cloudType": "SECURE", "imageName": "img",
                           "containerDiskInGb": 10, "name": "box"}, interruptible=False)
        for name in ("FLEET_SELF_STOP", "CONTAINER_ID", "CONTAINER_API_KEY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("RUNPOD_POD_ID", pod.id)
        monkeypatch.setenv("RUNPOD_API_KEY", RUNPOD_KEY)
        monkeypatch.setenv("FLEET_RUNPOD_API_URL", fake.base_url)
        stop_machine()
        assert fake.count("podStop") == 1 and fake.pod(pod.id)["desiredStatus"] == "EXITED"
    finally:
        fake.stop()


@pytest.mark.slow
def test_it_trusts_the_probe_only_with_its_sentinel(monkeypatch):
    ok, output = probe(sys.executable)
    assert ok, output
    monkeypatch.setenv("TRAINING_PROBE_EXTRA", "no_such_module_anywhere")
    ok, output = probe(sys.executable)
    assert not ok and "no_such_module_anywhere" in output


def test_it_stops_its_machine_with_the_configured_command(tmp_path, monkeypatch):
    flag = tmp_path / "stopped"
    monkeypatch.setenv("FLEET_SELF_STOP", f"touch {flag}")
    stop_machine()
    assert flag.exists()


def test_it_stops_its_own_vast_instance_with_the_container_key(market, monkeypatch):
    from fleet.providers.registry import get_provider
    from fleet.providers.records import RentRequest
    from tests.marketplace import MARKET_KEY

    with get_provider() as provider:
        offer = provider.search_offers(limit=1)[0]
        instance_id = provider.rent(RentRequest(offer_id=offer.offer_id, image="img", disk_gb=10, label="box", env={}))
        market.advance(120)
        monkeypatch.delenv("FLEET_SELF_STOP", raising=False)
        monkeypatch.setenv("CONTAINER_ID", instance_id)
        monkeypatch.setenv("CONTAINER_API_KEY", MARKET_KEY)
        monkeypatch.setenv("FLEET_VAST_API_URL", market.base_url)
        stop_machine()
        assert provider.get_instance(instance_id).status == "stopped"


def test_it_uploads_with_the_grant_each_heartbeat_renews(dashboard, tmp_path):
    # Presigned uploads expire after STORAGE_GRANT_S; a multi-day run keeps uploading with the renewed grant.
    uploader = Uploader(_api(dashboard), {"kind": "local", "path": str(tmp_path / "old")}, tmp_path / "out")
    dashboard.answers["heartbeat"] = {"command": "continue", "upload": {"kind": "local", "path": str(tmp_path / "new")}}
    beat = Heartbeat(_api(dashboard), interval_s=0.01, window_s=3600)
    beat.on_upload_grant = uploader.renew
    beat.beat()
    (tmp_path / "file").write_text("x")
    uploader._put(tmp_path / "file", "ckpt-p00-s00000002/file")
    assert (tmp_path / "new" / "ckpt-p00-s00000002" / "file").exists()
    assert not (tmp_path / "old").exists()


class _HeldApi:
    """The agent's API client, holding the first upload until released, recording what is declared complete."""

    def __init__(self):
        self.release, self.complete = threading.Event(), []

    def call(self, method, path, body=None):
        if body and not body["complete"]:
            self.release.wait(10)
        elif body:
            self.complete.append(body["uri"])
        return {}


def test_it_skips_checkpoints_a_slow_uplink_cannot_keep_up_with_but_never_a_phases_final(tmp_path):
    from training.checkpoint_names import checkpoint_name

    names = [checkpoint_name(0, step) for step in (2, 4, 6)] + [checkpoint_name(1, step) for step in (2, 4)]
    finals = frozenset({checkpoint_name(0, 6)})
    api = _HeldApi()
    uploader = Uploader(api, {"kind": "local", "path": str(tmp_path / "bucket")}, tmp_path / "outbox",
                              protected=finals)
    uploader.start()
    for name in names:
        folder = tmp_path / "store" / name
        folder.mkdir(parents=True)
        (folder / "trainer.pt").write_bytes(name.encode())
        (folder / "COMPLETE").write_text("done\n")
        uploader.offer(folder)
        time.sleep(0.05)
    api.release.set()
    uploader.close()
    assert api.complete == [names[0], checkpoint_name(0, 6), names[-1]]  # the first, the final, the newest


def test_the_probe_checks_the_runs_model_family_when_it_knows_it(tmp_path, monkeypatch):
    seen = tmp_path / "argv"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {seen}\necho TRAINING_PROBE_OK\n")
    fake.chmod(0o755)
    monkeypatch.setenv("FLEET_MODEL_TYPE", "qwen3_5_moe")
    assert probe(str(fake))[0]
    assert seen.read_text().split() == ["-m", "training.probe", "--family", "qwen3_5_moe"]
    monkeypatch.delenv("FLEET_MODEL_TYPE")
    probe(str(fake))
    assert seen.read_text().split() == ["-m", "training.probe"]


def test_one_backoff_doubles_to_its_cap_with_jitter():
    for attempt, nominal in ((1, 2.0), (2, 4.0), (3, 8.0), (5, 30.0), (9, 30.0)):
        waits = [backoff_s(attempt, 2.0, 30.0) for _ in range(50)]
        assert all(nominal * (1 - JITTER) <= w <= nominal * (1 + JITTER) for w in waits)
    assert len(set(waits)) > 1  # jittered, so boxes that failed together do not retry together


def test_retried_tries_again_only_what_it_is_told_to():
    calls, heard, waits = [], [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OSError("reset")
        return "done"

    assert retried(flaky, tries=3, first_s=1.0, cap_s=8.0, retry_on=(OSError,),
                   on_failure=lambda attempt, error: heard.append(attempt), sleep=waits.append) == "done"
    assert heard == [1, 2] and len(waits) == 2
    calls.clear()
    with pytest.raises(OSError):
        retried(flaky, tries=2, first_s=1.0, cap_s=8.0, retry_on=(OSError,), sleep=waits.append)
    assert len(calls) == 2 and len(waits) == 3  # no wait after the last try
    calls.clear()
    with pytest.raises(OSError):
        retried(flaky, tries=3, first_s=1.0, cap_s=8.0, retry_on=(ValueError,), sleep=waits.append)
    assert len(calls) == 1


def test_the_api_tries_a_5xx_again_but_not_a_4xx(dashboard):
    dashboard.status = 503
    api = Api(f"http://127.0.0.1:{dashboard.server_port}/api/agent/v1/", "run_token", attempts=2)
    with pytest.raises(ConnectionError, match="HTTP 503 after 2 tries"):
        api.call("POST", "events", {"kind": "log", "message": "x"})
    assert len(dashboard.posts) == 2
    dashboard.status, dashboard.posts[:] = 400, []
    with pytest.raises(Refused) as refused:
        api.call("POST", "events", {"kind": "log", "message": "x"})
    assert refused.value.status == 400 and len(dashboard.posts) == 1


def test_it_says_the_trainer_finished_again_while_the_final_checkpoint_is_being_sealed(dashboard):
    from training.agent.watch import report_finished

    dashboard.status, waits = 503, []

    def wait(seconds):  # the dashboard has sealed it by the third try
        waits.append(seconds)
        dashboard.status = 200 if len(waits) == 2 else 503

    report_finished(_api(dashboard), sleep=wait)
    assert [body["kind"] for _, body, _ in dashboard.posts] == ["finished"] * 3 and len(waits) == 2


def test_the_exit_codes_keep_their_numbers():
    # Boxes have exited with these since before they had names; logs and people read them.
    assert {code.name: int(code) for code in Exit} == {
        "OK": 0, "PROBE_FAILED": 1, "TRAINER_FAILED": 3, "MACHINE_STOPPED": 4, "DATA_REFUSED": 5,
        "MODEL_REFUSED": 6, "CHECKPOINT_UNREACHABLE": 7}
