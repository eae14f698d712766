"""A checkpoint the box cannot download is not a checkpoint that is wrong: a refused connection or a store answering
503 is tried again, and if it still fails the checkpoint is kept (never reported as rejected) for another box."""

import hashlib
import socket

import pytest

from training.agent import resume
from training.agent import run as agent_run
from training.agent.heartbeat import Heartbeat
from training.agent.retry import JITTER
from tests.http_servers import QuietHandler, serving

NAME = "ckpt-p01-s00000004"
DATA = b"optimizer state" * 64


class _Store(QuietHandler):
    """A checkpoint store that answers the first `failures` GETs with `status`, then the file."""

    def do_GET(self):
        self.server.gets += 1
        if self.server.gets <= self.server.failures:
            return self.answer(self.server.status)
        self.answer(200, self.server.body)


@pytest.fixture
def store_server():
    with serving(_Store, gets=0, failures=0, status=503, body=DATA) as server:
        yield server


class _Dashboard:
    """The agent's API client, recording what it posts."""

    def __init__(self, spec=None):
        self.posts, self.spec = [], spec

    def call(self, method, path, body=None):
        if method == "GET" and path == "spec":
            return self.spec
        self.posts.append((path, body))
        return {}


def _candidate(url, step=4):
    manifest = {"trainer.pt": {"size": len(DATA), "sha256": hashlib.sha256(DATA).hexdigest()}}
    return {"phase": 1, "step": step, "uri": f"ckpt-p01-s{step:08d}", "manifest": manifest,
            "download": {"kind": "s3-get", "files": {"trainer.pt": url + "?X-Amz-Signature=secret"}}}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens on it once the socket is closed


def test_a_store_answering_503_keeps_the_checkpoint_and_fails_the_restore(store_server, tmp_path):
    store_server.failures = 100
    api, pauses = _Dashboard(), []
    with pytest.raises(resume.RestoreFailed, match="503") as failed:
        resume.restore(api, [_candidate(f"http://127.0.0.1:{store_server.server_port}/trainer.pt")],
                      tmp_path / "store", tries=3, sleep=pauses.append)
    assert api.posts == []  # nothing rejected: the dashboard offers the checkpoint to the next box
    assert store_server.gets == 3 and pauses == pytest.approx([2.0, 4.0], rel=JITTER)
    assert "secret" not in str(failed.value)
    assert not any((tmp_path / "store").glob("*"))


def test_a_refused_connection_keeps_the_checkpoint_and_fails_the_restore(tmp_path):
    api = _Dashboard()
    with pytest.raises(resume.RestoreFailed, match="ConnectError"):
        resume.restore(api, [_candidate(f"http://127.0.0.1:{_closed_port()}/trainer.pt")], tmp_path / "store",
                      tries=2, sleep=lambda s: None)
    assert api.posts == [] and not any((tmp_path / "store").glob("*"))


def test_a_store_that_comes_back_restores_the_checkpoint(store_server, tmp_path):
    store_server.failures = 2
    api = _Dashboard()
    candidate = _candidate(f"http://127.0.0.1:{store_server.server_port}/trainer.pt")
    assert resume.restore(api, [candidate], tmp_path / "store", tries=3, sleep=lambda s: None) is candidate
    assert (tmp_path / "store" / NAME / "trainer.pt").read_bytes() == DATA
    assert (tmp_path / "store" / NAME / "COMPLETE").exists() and api.posts == []


def test_a_file_that_does_not_match_is_still_rejected_at_once(store_server, tmp_path):
    store_server.body = b"planted" * 100
    api = _Dashboard()
    url = f"http://127.0.0.1:{store_server.server_port}/trainer.pt"
    assert resume.restore(api, [_candidate(url)], tmp_path / "store", tries=3, sleep=lambda s: None) is None
    assert store_server.gets == 1
    assert [(path, body["step"]) for path, body in api.posts] == [("checkpoints/rejected", 4)]
    assert "does not match its manifest" in api.posts[0][1]["reason"]


def test_a_box_that_cannot_download_its_checkpoint_stops_without_training(tmp_path, monkeypatch):
    spec = {"heartbeat_interval_s": 5, "dead_man_window_s": 3600, "recipe": {}, "phases": [],
            "resume": [_candidate(f"http://127.0.0.1:{_closed_port()}/trainer.pt")]}
    api = _Dashboard(spec)
    monkeypatch.setattr(agent_run, "probe", lambda python: (True, "probe ok"))
    monkeypatch.setattr(resume, "RESTORE_TRIES", 1)
    code = agent_run.run(api, Heartbeat(api, 5, 3600), tmp_path / "box", "python")
    assert code != 0 and [path for path, _ in api.posts] == ["events", "events"]
    kind, message = api.posts[1][1]["kind"], api.posts[1][1]["message"]
    assert kind == "log" and f"{NAME} could not be downloaded" in message and "secret" not in message
    assert not (tmp_path / "box" / "recipe.json").exists()  # the trainer was never started
