"""`python -m training.agent`, the worker image's entry point: where to report, as whom and how often, read from the
box's environment."""

import logging
import os
import sys
from pathlib import Path

from .dashboard import Api
from .exit_codes import Exit
from .heartbeat import Heartbeat
from .run import run

HEARTBEAT_S, DEAD_MAN_S = 5.0, 3 * 3600.0  # until the spec gives the dashboard's own


def main() -> Exit:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s agent %(message)s")
    api = Api(os.environ["FLEET_API_URL"], os.environ["FLEET_AGENT_TOKEN"])
    workdir = Path(os.environ.get("FLEET_WORKDIR", "fleet-run")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    python = os.environ.get("FLEET_PYTHON", sys.executable)
    heartbeat = Heartbeat(api, float(os.environ.get("FLEET_HEARTBEAT_S", HEARTBEAT_S)),
                          float(os.environ.get("FLEET_DEAD_MAN_S", DEAD_MAN_S)))
    heartbeat.start()
    try:
        return run(api, heartbeat, workdir, python)
    finally:
        heartbeat.finish()


if __name__ == "__main__":
    sys.exit(main())
