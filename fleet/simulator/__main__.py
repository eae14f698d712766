"""`python -m fleet.simulator`: serve a simulated vast.ai until SIGTERM or SIGINT.

Prints one line with the API's base URL once it answers; the API key comes from --api-key or SIMULATOR_API_KEY,
the optional control token from --control-token or SIMULATOR_CONTROL_TOKEN.
"""

import argparse
import logging
import os
import signal
import sys
import threading

from .agents import AgentProcesses
from .marketplace import SimulatedMarketplace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fleet.simulator", description="Serve a simulated vast.ai marketplace until SIGTERM or SIGINT."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument("--api-key", default=os.environ.get("SIMULATOR_API_KEY"))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--speed", type=float, default=1.0, help="simulated seconds per real second")
    parser.add_argument("--boot-delay", type=float, default=90.0, help="simulated seconds from rent to running")
    parser.add_argument("--offers", type=int, default=300, help="offers in the catalogue")
    parser.add_argument("--search-limit", type=int, default=600, help="searches a minute per client")
    parser.add_argument("--charges-interval", type=float, default=1.0,
                        help="real seconds a client must wait between two GET /charges/")
    parser.add_argument("--control-token", default=os.environ.get("SIMULATOR_CONTROL_TOKEN"))
    parser.add_argument("--verbose", action="store_true", help="log every request")
    parser.add_argument("--run-agents", metavar="FOLDER",
                        help="run each booted instance's onstart command (the on-box agent, a serving box's start "
                             "script) as a local process, each in its own subfolder of FOLDER; boxes then show "
                             "127.0.0.1 and free local ports")
    parser.add_argument("--state-file", metavar="FILE", default="",
                        help="keep the marketplace's state here (instances, account, the next instance id), so that "
                             "a restart lists the same instances and never hands out an id again")
    args = parser.parse_args(argv)
    if not args.api_key:
        parser.error("an API key is required: --api-key or SIMULATOR_API_KEY")

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    agents = AgentProcesses(args.run_agents) if args.run_agents else None
    sim = SimulatedMarketplace(
        api_key=args.api_key, seed=args.seed, speed=args.speed, boot_delay_s=args.boot_delay, host=args.host,
        port=args.port, offer_count=args.offers, search_limit_per_min=args.search_limit,
        charges_min_interval_s=args.charges_interval, control_token=args.control_token, hooks=agents,
        loopback_boxes=agents is not None,  # the boxes run here: what they serve is on this machine's ports
        state_file=args.state_file,
    )
    try:
        with sim:
            print(f"simulated vast.ai API at {sim.base_url} (control API at {sim.control_url})", flush=True)
            while not stop.wait(0.5):
                pass
    finally:
        if agents:
            agents.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
