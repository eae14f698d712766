"""The official clients as a test drives them: the `vastai` command, and an SDK run by drive.py in its own process."""

import json
import subprocess
from pathlib import Path

from tests.marketplace import MARKET_KEY

DRIVE = Path(__file__).with_name("drive.py")


class Cli:
    """The `vastai` command pointed at the simulated marketplace; `json(...)` adds --raw and decodes stdout."""

    def __init__(self, executable: Path, url: str, env: dict):
        self.executable, self.url, self.env = executable, url, env

    def run(self, *args: str, api_key: str = MARKET_KEY) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.executable), "--url", self.url, "--api-key", api_key, "--no-color", *args],
                              capture_output=True, text=True, env=self.env, timeout=120, stdin=subprocess.DEVNULL)

    def json(self, *args: str):
        done = self.run(*args, "--raw")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


class Sdk:
    """An official SDK in its own process: `calls([(name, kwargs), ...])` -> one answer per call."""

    def __init__(self, python: Path, kind: str, url: str, api_key: str, env: dict):
        self.python, self.kind, self.env = python, kind, env
        self.connect = {"url": url, "api_key": api_key}

    def calls(self, calls: list[tuple[str, dict]], api_key: str | None = None) -> list[dict]:
        request = {"connect": {**self.connect, **({"api_key": api_key} if api_key else {})}, "calls": calls}
        done = subprocess.run([str(self.python), str(DRIVE), self.kind], input=json.dumps(request),
                              capture_output=True, text=True, env=self.env, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def value(self, function: str, /, **kwargs):
        (answer,) = self.calls([(function, kwargs)])
        assert "value" in answer, answer
        return answer["value"]
