"""The official marketplace clients (vastai, runpod) as fixtures, each run from .venv-clients as its own program.

scripts/test makes that environment (scripts/setup-clients); a bare `pytest` makes it here on first use.
"""

import os
import subprocess
from pathlib import Path

import pytest

from tests.clients.official import Cli, Sdk
from tests.fleet.runpod_server import RUNPOD_KEY, FakeRunPod
from tests.marketplace import MARKET_KEY

REPO = Path(__file__).resolve().parents[2]
CLIENTS = REPO / ".venv-clients" / "bin"


@pytest.fixture(scope="session")
def clients_bin() -> Path:
    subprocess.run([str(REPO / "scripts" / "setup-clients")], check=True, timeout=900)
    return CLIENTS


@pytest.fixture(scope="session")
def client_home(tmp_path_factory) -> dict:
    """An environment with a home of its own: no stored key or config of the machine's user is read or written."""
    home = tmp_path_factory.mktemp("client-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAST_", "RUNPOD_"))}
    return {**env, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "COLUMNS": "200",
            "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"}


@pytest.fixture
def vastai_cli(clients_bin, client_home, market) -> Cli:
    return Cli(clients_bin / "vastai", market.origin, client_home)


@pytest.fixture
def vast_sdk(clients_bin, client_home, market) -> Sdk:
    return Sdk(clients_bin / "python", "vast", market.origin, MARKET_KEY, client_home)


@pytest.fixture
def runpod_fake():
    server = FakeRunPod(boot_polls=1).start()
    yield server
    server.stop()


@pytest.fixture
def runpod_sdk(clients_bin, client_home, runpod_fake) -> Sdk:
    origin = runpod_fake.base_url.removesuffix("/graphql")
    return Sdk(clients_bin / "python", "runpod", origin, RUNPOD_KEY, client_home)
