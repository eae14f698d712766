"""The eval phase on the box (docs/agent.md, "The eval phase"): once the finals are banked, `python -m
training.evaluation` runs as a child under the phase's time limit; its samples are forwarded in batches, then
evaluation/finish, or evaluation/failed with the reason. Either way the box's work ends normally."""

import json
import logging
import signal
import subprocess
import time
from pathlib import Path

from .dashboard import Api, Refused
from .exit_codes import Exit
from .heartbeat import Heartbeat
from .retry import retried
from .self_stop import stop_machine

log = logging.getLogger(__name__)

EVAL_KIND = "eval"  # training.recipe.EVAL_KIND, which the agent does not import (no torch before the probe)
# How `python -m training.evaluation` ends on a recipe, record or scorer error: this exit, after this line on stderr.
CHILD_ERROR_EXIT, CHILD_ERROR_MARK = 2, "evaluation error: "
START_EVERY_S, START_PATIENCE_S = 10.0, 1800.0  # evaluation/start, asked again while the finals are being sealed
MAX_SAMPLES_A_POST = 100
MAX_TEXT_CHARS, CUT_MARK = 20_000, " [cut]"
TEXT_FIELDS = ("prompt", "expected", "base_answer", "adapter_answer")
FINISH_TRIES = 12
LOG_TAIL_BYTES = 3000
STOP_GRACE_S = 30.0  # between SIGTERM and SIGKILL of a child that overran or was told to stop


class EvaluationFailed(Exception):
    """The eval phase cannot go on; the message is the reason the dashboard shows."""


def eval_phase(recipe: dict) -> int | None:
    """The index of the recipe's eval phase (its last), or None."""
    phases = recipe.get("phases") or []
    return len(phases) - 1 if phases and phases[-1].get("kind") == EVAL_KIND else None


def cut(text) -> str:
    """A sample's text as the dashboard takes it: at most MAX_TEXT_CHARS characters (a longer one cut, ending
    CUT_MARK), NUL characters (which PostgreSQL cannot store) as U+FFFD."""
    text = str(text).replace("\x00", "\ufffd")
    return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS - len(CUT_MARK)] + CUT_MARK


class SampleForwarder:
    """Forwards the child's samples file from where it left off, in posts of at most MAX_SAMPLES_A_POST; a
    dashboard that does not answer keeps them for the next round, one that refuses them fails the evaluation."""

    def __init__(self, api: Api, path: Path, phase: int):
        self.api, self.path, self.phase = api, path, phase
        self.position, self.forwarded = 0, 0

    def flush(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(self.position)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]  # a half-written last line waits for the next round
        lines = complete.splitlines(keepends=True)
        start = 0
        while start < len(lines):
            chunk = lines[start:start + MAX_SAMPLES_A_POST]
            samples = [self._sample(line) for line in chunk if line.strip()]
            if samples and not self._post(samples):
                return
            self.position += sum(len(line) for line in chunk)
            self.forwarded += len(samples)
            start += MAX_SAMPLES_A_POST

    def _sample(self, line: bytes) -> dict:
        try:
            sample = json.loads(line)
            return {**sample, **{key: cut(sample[key]) for key in TEXT_FIELDS}}
        except (ValueError, KeyError, TypeError) as exc:
            raise EvaluationFailed(f"the evaluation wrote a sample that cannot be read: {line[:200]!r}") from exc

    def _post(self, samples: list[dict]) -> bool:
        try:
            self.api.call("POST", "evaluation/samples", {"phase": self.phase, "samples": samples})
        except ConnectionError as exc:
            log.warning("eval samples not sent, kept for the next round: %s", exc)
            return False
        except Refused as exc:
            raise EvaluationFailed(f"the dashboard refused the evaluation's samples: {exc}") from None
        return True


def evaluate(api: Api, heartbeat: Heartbeat, recipe_path: Path, workdir: Path, python: str, *,
             done=(), start_every_s: float = START_EVERY_S, start_patience_s: float = START_PATIENCE_S,
             sleep=time.sleep) -> Exit:
    """The eval phase of the recipe at `recipe_path`, from evaluation/start to its end (see the module's doc)."""
    recipe = json.loads(recipe_path.read_text())
    phase = eval_phase(recipe)
    assert phase is not None, "evaluate is called for a recipe with an eval phase"
    limit_s = int(recipe["phases"][phase].get("time_limit_s") or 3600)
    try:
        recorded = _start(api, heartbeat, phase, start_every_s, start_patience_s, sleep)
        if recorded is None:  # told to stop while waiting
            return _stopped(heartbeat)
        return _run_child(api, heartbeat, recipe_path, workdir, python, phase, limit_s, set(done) | recorded, sleep)
    except EvaluationFailed as exc:
        log.warning("the evaluation failed: %s", exc)
        _failed(api, phase, str(exc))
        return Exit.OK


def _start(api, heartbeat, phase, every_s, patience_s, sleep) -> set[int] | None:
    """The sample indices the dashboard already holds, once it says the finals are banked; None if told to stop."""
    started = time.monotonic()
    while True:
        heartbeat.status = {"state": "uploading", "process_alive": False, "phase": phase}
        try:
            answer = api.call("POST", "evaluation/start", {"phase": phase})
            done = answer.get("done") if isinstance(answer, dict) else None
            if not isinstance(done, list) or not all(isinstance(i, int) and i >= 0 for i in done):
                raise EvaluationFailed(f"evaluation/start answered without a list of done samples: {str(answer)[:200]}")
            return set(done)
        except Refused as exc:
            if exc.status != 409:
                raise EvaluationFailed(f"the dashboard refused to start the evaluation: {exc}") from None
            waiting = str(exc)
        except ConnectionError as exc:
            waiting = str(exc)
        if time.monotonic() - started >= patience_s:
            raise EvaluationFailed(f"the trained adapters were not banked after {patience_s:.0f} s, so the evaluation "
                                   f"did not start: {waiting}"[:4000])
        log.info("evaluation/start not yet: %s", waiting[:300])
        if heartbeat.stop.is_set():
            return None
        sleep(every_s)


def _run_child(api, heartbeat, recipe_path, workdir, python, phase, limit_s, done, sleep) -> Exit:
    samples, summary = workdir / "eval-samples.jsonl", workdir / "eval-summary.json"
    done_path = workdir / "eval-done.json"
    done_path.write_text(json.dumps(sorted(done)))
    summary.unlink(missing_ok=True)
    forwarder = SampleForwarder(api, samples, phase)
    command = [python, "-m", "training.evaluation", "--recipe", str(recipe_path), "--samples", str(samples),
               "--done", str(done_path), "--summary", str(summary)]
    log_path = workdir / "eval.log"
    with open(log_path, "ab") as child_log:
        child = subprocess.Popen(command, stdout=child_log, stderr=subprocess.STDOUT)
        started, overran = time.monotonic(), False
        while child.poll() is None:
            heartbeat.status = {"state": "evaluating", "process_alive": True, "phase": phase}
            forwarder.flush()
            if heartbeat.stop.is_set():
                log.warning("stopping the evaluation: %s", heartbeat.stop_reason)
                _end(child)
                return _stopped(heartbeat)
            if time.monotonic() - started > limit_s:
                overran = True
                _end(child)
                break
            heartbeat.stop.wait(min(heartbeat.interval_s, 2.0))
    heartbeat.status = {"state": "evaluating", "process_alive": False, "phase": phase}
    forwarder.flush()
    if overran:
        raise EvaluationFailed(f"The evaluation ran over its time limit of {limit_s} s "
                               f"({forwarder.forwarded} samples recorded by then).")
    if child.returncode != 0:
        tail = log_path.read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace")
        raise EvaluationFailed(f"The evaluation exited with {child.returncode}: "
                               f"{failure_words(child.returncode, tail)}"[-4000:])
    _drain(forwarder, sleep)
    result = json.loads(summary.read_text()) if summary.exists() else {}
    _finish(api, phase, result)
    return Exit.OK


def failure_words(returncode: int, tail: str) -> str:
    """What a failed child's log says of its end: its own error when it stopped on one (CHILD_ERROR_EXIT, the text
    after its last CHILD_ERROR_MARK), not the libraries' warnings before it; else the end of the log, a crash's
    traceback."""
    start = tail.rfind(CHILD_ERROR_MARK)
    if returncode == CHILD_ERROR_EXIT and start >= 0:
        return tail[start + len(CHILD_ERROR_MARK):].strip()
    return tail


def _drain(forwarder: SampleForwarder, sleep) -> None:
    """Every sample forwarded before the end is reported: a dashboard that does not answer is asked again."""
    for attempt in range(1, FINISH_TRIES + 1):
        forwarder.flush()
        if not forwarder.path.exists() or forwarder.position >= forwarder.path.stat().st_size:
            return
        sleep(min(60.0, 5.0 * 2 ** (attempt - 1)))
    raise EvaluationFailed(f"the evaluation's samples could not be forwarded ({forwarder.forwarded} were)")


def _end(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _stopped(heartbeat: Heartbeat) -> Exit:
    if heartbeat.self_stop:
        log.warning("stopping this machine: %s", heartbeat.stop_reason)
        stop_machine()
        return Exit.MACHINE_STOPPED
    return Exit.OK


def _finish(api: Api, phase: int, result: dict) -> None:
    body = {"phase": phase, "generated_with": "vllm" if result.get("generated_with") == "vllm" else "transformers",
            "tokens_per_s": float(result.get("tokens_per_s") or 0.0)}
    try:
        retried(lambda: api.call("POST", "evaluation/finish", body), tries=FINISH_TRIES, first_s=5.0, cap_s=60.0,
                retry_on=(ConnectionError,))
    except Refused as exc:
        raise EvaluationFailed(f"the dashboard did not accept the evaluation's end: {exc}") from None
    except ConnectionError as exc:
        raise EvaluationFailed(f"the evaluation's end could not be reported: {exc}") from None


def _failed(api: Api, phase: int, reason: str) -> None:
    try:
        retried(lambda: api.call("POST", "evaluation/failed", {"phase": phase, "reason": reason[-4000:]}),
                tries=FINISH_TRIES, first_s=5.0, cap_s=60.0, retry_on=(ConnectionError,))
    except (Refused, ConnectionError) as exc:
        log.warning("evaluation/failed not accepted: %s", exc)
