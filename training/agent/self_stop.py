"""A box stopping its own machine, so that only its disk bills: a configured command, or the provider's API with
the key it gives each machine (vast.ai's, RunPod's), which can stop only that machine."""

import logging
import os
import subprocess

import httpx

log = logging.getLogger(__name__)

VAST_API_URL = "https://console.vast.ai/api/v0"
RUNPOD_API_URL = "https://api.runpod.io/graphql"


def stop_machine() -> None:
    """Stops this machine from inside: FLEET_SELF_STOP if set, else vast.ai's CONTAINER_ID/CONTAINER_API_KEY, else
    RunPod's RUNPOD_POD_ID/RUNPOD_API_KEY. A refusal or a dead API is logged: the trainer is stopped either way."""
    command = os.environ.get("FLEET_SELF_STOP", "")
    try:
        if command:
            log.warning("stopping this machine: %s", command)
            subprocess.run(command, shell=True, timeout=120)
        elif os.environ.get("CONTAINER_ID") and os.environ.get("CONTAINER_API_KEY"):
            _stop_vast(os.environ["CONTAINER_ID"], os.environ["CONTAINER_API_KEY"])
        elif os.environ.get("RUNPOD_POD_ID") and os.environ.get("RUNPOD_API_KEY"):
            _stop_runpod(os.environ["RUNPOD_POD_ID"], os.environ["RUNPOD_API_KEY"])
        else:
            log.warning("no FLEET_SELF_STOP and no machine key: the trainer is stopped, the machine is not")
    except (httpx.HTTPError, subprocess.SubprocessError, OSError) as exc:
        log.warning("stopping this machine failed: %s", exc)


def _stop_vast(instance: str, key: str) -> None:
    api = os.environ.get("FLEET_VAST_API_URL", VAST_API_URL).rstrip("/")
    log.warning("stopping vast.ai instance %s", instance)
    response = httpx.put(f"{api}/instances/{instance}/", json={"state": "stopped"},
                         headers={"Authorization": f"Bearer {key}"}, timeout=30)
    if response.status_code >= 400:
        log.warning("the stop was refused: HTTP %s", response.status_code)


def _stop_runpod(pod: str, key: str) -> None:
    api = os.environ.get("FLEET_RUNPOD_API_URL", RUNPOD_API_URL)
    log.warning("stopping RunPod pod %s", pod)
    response = httpx.post(api, json={"query": "mutation Stop($input: PodStopInput!) { podStop(input: $input) { id } }",
                                     "variables": {"input": {"podId": pod}}},
                          headers={"Authorization": f"Bearer {key}"}, timeout=30)
    answer = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
    if response.status_code >= 400 or answer.get("errors"):
        log.warning("the stop was refused: HTTP %s %s", response.status_code, str(answer.get("errors"))[:300])
