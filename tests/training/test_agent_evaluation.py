"""The agent's eval phase against a real local HTTP server standing in for the dashboard's four evaluation endpoints:
the wait while the finals are sealed (409 then 200), the real child on a tiny trained run, a child that crashes or
overruns its time limit (evaluation/failed with the reason), long texts cut, and the heartbeat's state meanwhile."""

import json
import os
import sys
import time

import pytest

from training.agent.dashboard import Api
from training.agent.evaluation import CUT_MARK, MAX_TEXT_CHARS, evaluate
from training.agent.exit_codes import Exit
from training.agent.heartbeat import Heartbeat
from training.agent.run import run
from tests.http_servers import QuietHandler, serving

from .tiny_eval_run import tiny_eval_recipe, train_tiny_eval_run


class _Dashboard(QuietHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        path = self.path.split("/api/agent/v1/", 1)[-1]
        self.server.posts.append((path, body))
        queued = self.server.answers.get(path, [])
        status, answer = queued.pop(0) if len(queued) > 1 else (queued[0] if queued else (200, {}))
        if path == "heartbeat" and body.get("state") in self.server.refused_states:
            status, answer = 422, {"detail": [{"msg": "unknown state"}]}
        self.answer(status, answer)

    def do_GET(self):
        self.answer(200, self.server.spec)


@pytest.fixture
def dashboard():
    answers = {"heartbeat": [(200, {"command": "continue"})], "evaluation/start": [(200, {"done": []})],
               "evaluation/samples": [(200, {"recorded": 1})], "evaluation/finish": [(200, {})],
               "evaluation/failed": [(200, {})]}
    with serving(_Dashboard, posts=[], refused_states=set(), answers=answers) as server:
        yield server


@pytest.fixture
def agent(dashboard):
    api = Api(f"http://127.0.0.1:{dashboard.server_port}/api/agent/v1/", "run_token", attempts=1)
    heartbeat = Heartbeat(api, 0.05, 3600)
    heartbeat.start()
    yield api, heartbeat
    heartbeat.finish()


def _posts(dashboard, path):
    return [body for where, body in dashboard.posts if where == path]


FAKE_CHILD = """#!{python}
import json, os, sys, time
args = dict(zip(sys.argv[3::2], sys.argv[4::2]))
mode = os.environ["FAKE_EVAL"]
with open(args["--samples"], "a") as out:
    for i in range(int(os.environ.get("FAKE_SAMPLES", "1"))):
        answer = "x" * 30000 + "\\x00" if mode == "long" else "a"
        out.write(json.dumps({{"index": i, "prompt": "p", "expected": "e", "base_answer": answer,
                              "adapter_answer": "b", "base_score": 0.0, "adapter_score": 1.0}}) + "\\n")
if mode == "crash":
    print("Traceback: RuntimeError: CUDA error: an illegal memory access was encountered", flush=True)
    sys.exit(3)
if mode == "error":
    print("W1204 a warning the libraries print as they import", flush=True)
    print("evaluation error: record 2: the scorer training.examples.rewards:contains_answer raised KeyError: 'answer'",
          file=sys.stderr, flush=True)
    sys.exit(2)
if mode == "hang":
    time.sleep(120)
with open(args["--summary"], "w") as f:
    json.dump({{"generated_with": "vllm", "tokens_per_s": 1234.5}}, f)
"""


@pytest.fixture
def fake_child(tmp_path, monkeypatch):
    """A stand-in for `python -m training.evaluation` that FAKE_EVAL tells what to do; the recipe it is given."""
    script = tmp_path / "fake-python"
    script.write_text(FAKE_CHILD.format(python=sys.executable))
    script.chmod(0o755)
    recipe = tmp_path / "recipe.json"

    def make(mode, samples=1, **eval_settings):
        monkeypatch.setenv("FAKE_EVAL", mode)
        monkeypatch.setenv("FAKE_SAMPLES", str(samples))
        recipe.write_text(json.dumps(tiny_eval_recipe(tmp_path, **eval_settings)))
        return recipe, str(script)

    return make


def test_it_waits_for_the_banked_finals_then_evaluates_with_the_real_child(dashboard, agent, tmp_path):
    recipe = train_tiny_eval_run(tmp_path)
    dashboard.answers["evaluation/start"] = [(409, {"detail": "sft's final is being sealed"})] * 2 + [
        (200, {"done": [1]})]
    api, heartbeat = agent

    def until_a_beat_says_uploading(_seconds):  # the wait lasts until the heartbeat has told the dashboard of it
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "uploading" not in {b["state"] for b in _posts(dashboard, "heartbeat")}:
            time.sleep(0.01)

    assert evaluate(api, heartbeat, recipe, tmp_path, sys.executable, start_every_s=0.01,
                    sleep=until_a_beat_says_uploading) == Exit.OK
    assert len(_posts(dashboard, "evaluation/start")) == 3
    assert all(body == {"phase": 1} for body in _posts(dashboard, "evaluation/start"))
    sent = [sample for body in _posts(dashboard, "evaluation/samples") for sample in body["samples"]]
    assert sorted(sample["index"] for sample in sent) == [0, 2, 3, 4]  # 1 was recorded already
    assert all(0 <= sample["base_score"] <= 1 and isinstance(sample["adapter_answer"], str) for sample in sent)
    finish = _posts(dashboard, "evaluation/finish")
    assert len(finish) == 1 and finish[0]["phase"] == 1 and finish[0]["generated_with"] == "transformers"
    assert finish[0]["tokens_per_s"] > 0
    assert not _posts(dashboard, "evaluation/failed")
    assert {"uploading", "evaluating"} <= {body["state"] for body in _posts(dashboard, "heartbeat")}


def test_a_crash_is_reported_with_the_end_of_its_log(dashboard, agent, fake_child, tmp_path):
    recipe, python = fake_child("crash")
    assert evaluate(*agent, recipe, tmp_path, python) == Exit.OK  # the box's work ends normally
    assert [s["index"] for body in _posts(dashboard, "evaluation/samples") for s in body["samples"]] == [0]
    (failed,) = _posts(dashboard, "evaluation/failed")
    assert failed["phase"] == 1 and failed["reason"].startswith("The evaluation exited with 3: ")
    assert "CUDA error: an illegal memory access" in failed["reason"]
    assert not _posts(dashboard, "evaluation/finish")


def test_an_error_the_child_stopped_on_is_reported_as_it_said_it(dashboard, agent, fake_child, tmp_path):
    recipe, python = fake_child("error")
    assert evaluate(*agent, recipe, tmp_path, python) == Exit.OK
    (failed,) = _posts(dashboard, "evaluation/failed")
    assert failed["reason"] == ("The evaluation exited with 2: record 2: the scorer "
                                "training.examples.rewards:contains_answer raised KeyError: 'answer'")
    assert not _posts(dashboard, "evaluation/finish")


def test_an_overrun_is_stopped_and_reported_with_its_limit(dashboard, agent, fake_child, tmp_path):
    recipe, python = fake_child("hang", time_limit_s=1)
    started = time.monotonic()
    assert evaluate(*agent, recipe, tmp_path, python) == Exit.OK
    assert time.monotonic() - started < 30  # the child was stopped, not waited for
    (failed,) = _posts(dashboard, "evaluation/failed")
    assert failed["reason"] == "The evaluation ran over its time limit of 1 s (1 samples recorded by then)."
    assert not _posts(dashboard, "evaluation/finish")


def test_finals_never_banked_fail_the_evaluation_with_the_dashboards_reason(dashboard, agent, fake_child, tmp_path):
    recipe, python = fake_child("ok")
    dashboard.answers["evaluation/start"] = [(409, {"detail": "sft's final checkpoint is not sealed"})]
    assert evaluate(*agent, recipe, tmp_path, python, start_every_s=0.01, start_patience_s=0.2) == Exit.OK
    (failed,) = _posts(dashboard, "evaluation/failed")
    assert failed["reason"].startswith("the trained adapters were not banked after 0 s")
    assert "sft's final checkpoint is not sealed" in failed["reason"]
    assert not _posts(dashboard, "evaluation/samples")


def test_samples_go_in_posts_of_at_most_100_their_long_texts_cut(dashboard, agent, fake_child, tmp_path):
    recipe, python = fake_child("long", samples=250)
    assert evaluate(*agent, recipe, tmp_path, python) == Exit.OK
    posts = _posts(dashboard, "evaluation/samples")
    assert sum(len(body["samples"]) for body in posts) == 250 and max(len(body["samples"]) for body in posts) <= 100
    answer = posts[0]["samples"][0]["base_answer"]
    assert len(answer) == MAX_TEXT_CHARS and answer.endswith(CUT_MARK) and "\x00" not in answer
    assert _posts(dashboard, "evaluation/finish") == [{"phase": 1, "generated_with": "vllm", "tokens_per_s": 1234.5}]


def test_a_refused_post_of_samples_fails_the_evaluation(dashboard, agent, fake_child, tmp_path):
    recipe, python = fake_child("ok")
    dashboard.answers["evaluation/samples"] = [(422, {"detail": "samples[0].base_score: not in [0, 1]"})]
    assert evaluate(*agent, recipe, tmp_path, python) == Exit.OK
    (failed,) = _posts(dashboard, "evaluation/failed")
    assert "the dashboard refused the evaluation's samples" in failed["reason"] and "not in [0, 1]" in failed["reason"]


def test_a_dashboard_that_does_not_know_the_evaluating_state_hears_training(dashboard, agent):
    dashboard.refused_states = {"evaluating"}
    api, heartbeat = agent
    heartbeat.status = {"state": "evaluating", "process_alive": True, "phase": 1}
    time.sleep(0.5)
    states = [body["state"] for body in _posts(dashboard, "heartbeat")]
    assert states.count("evaluating") == 1 and states[-1] == "training"
    assert not heartbeat.stop.is_set()


def test_the_eval_child_gets_the_recipe_and_the_done_samples(dashboard, agent, fake_child, tmp_path):
    recipe, python = fake_child("ok")
    dashboard.answers["evaluation/start"] = [(200, {"done": [4]})]
    assert evaluate(*agent, recipe, tmp_path, python, done=[2]) == Exit.OK
    assert json.loads((tmp_path / "eval-done.json").read_text()) == [2, 4]
    assert os.path.exists(tmp_path / "eval.log")


def test_a_box_told_everything_is_banked_only_evaluates(dashboard, agent, fake_child, tmp_path, monkeypatch):
    recipe, python = fake_child("ok", samples=3)
    dashboard.spec = {"heartbeat_interval_s": 0.05, "dead_man_window_s": 3600, "recipe": json.loads(recipe.read_text()),
                      "resume": [], "phases": [], "upload": {"kind": "local", "path": str(tmp_path / "bucket")},
                      "max_metric_points": 500, "evaluation": {"phase": 1, "done": [0]}}
    monkeypatch.setattr("training.agent.run.probe", lambda python: (True, "probe ok"))
    api, heartbeat = agent
    assert run(api, heartbeat, tmp_path / "work", python) == Exit.OK
    assert not (tmp_path / "work" / "trainer.log").exists()  # nothing trained
    assert json.loads((tmp_path / "work" / "eval-done.json").read_text()) == [0]
    assert _posts(dashboard, "evaluation/finish") == [{"phase": 1, "generated_with": "vllm", "tokens_per_s": 1234.5}]
