"""Serving a fine-tuned adapter: what its box runs before vLLM starts, and how a probe tells that vLLM serves it
(docs/fleet.md, "fleet/inference/adapters.py")."""

import json
import re
import shlex
from pathlib import Path

from django.conf import settings

from fleet import hooks
from fleet.inference import checkin
from fleet.inference.vllm_command import TENSOR_PARALLEL, serve_command

ENV = "FLEET_ADAPTER"
VLLM_FILES = ("adapter_config.json", "adapter_model.safetensors")  # what vLLM loads an adapter from
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # an adapter name: a word /v1/models lists as it is
FETCH_SOURCE = (Path(__file__).with_name("adapter_fetch.py")).read_text()
FETCH_END = "FLEET_ADAPTER_FETCH_END"
MAX_SERVED_RANK = 512  # vLLM's largest --max-lora-rank: a higher rank is refused when vLLM starts
# Far above any vLLM LoRA export (rank 512 at most); each file's download is capped at its manifest's size too.
MAX_ADAPTER_BYTES = 64 * 1024**3


# -- what /v1/models must say (pure) --------------------------------------------------------------------------------


def listing_problem(body: bytes, adapter: str, base: str) -> str:
    """Why an OpenAI models list does not show `adapter` served on `base`, or "" when it does. The body has passed
    probes.models_in already: it is a list of entries with ids."""
    entries = {entry["id"]: entry for entry in json.loads(body)["data"]}
    if adapter not in entries:
        return f"serves {', '.join(entries)} but not the adapter {adapter}"
    parent = entries[adapter].get("parent")
    if parent is not None and parent != base:
        return f"lists the adapter {adapter} on {parent}, not on {base}"
    if base not in entries:
        return f"lists the adapter {adapter} but not its base {base}"
    return ""


# -- what the box gets ----------------------------------------------------------------------------------------------


def box_env(model) -> dict[str, str]:
    """The adapter's read grant and manifest, made now: a box rented later (a replacement) gets a fresh one. A grant
    of presigned URLs runs to thousands of characters, so it goes in parts (FLEET_ADAPTER_0, _1, ... and
    FLEET_ADAPTER_PARTS, their number), which the fetch program joins."""
    grant = hooks.read_grant(model.adapter_uri, sorted(model.adapter_manifest), settings.STORAGE_GRANT_S)
    text = json.dumps({"grant": grant, "manifest": model.adapter_manifest}, sort_keys=True)
    return checkin.env_parts(ENV, text)


def start_script(model) -> str:
    """The box's start script: the watchdog (checkin.START), the adapter fetched and checked into its work folder, then
    vLLM in the background with it (an ssh-type box does not run the image's entrypoint). A failed fetch ends the
    script before vLLM starts, so the probes fail and the fleet replaces the box."""
    if FETCH_END in FETCH_SOURCE:
        raise ValueError("the fetch program holds its own heredoc end marker")
    name = shlex.quote(model.name)
    return "\n".join([
        "set -eu",
        'root="${FLEET_WORKDIR:-/workspace}"',
        'mkdir -p "$root"',
        checkin.START,
        f'adapter="$root/adapters/"{name}',
        f"rank=$(python3 - \"$adapter\" <<'{FETCH_END}'",
        FETCH_SOURCE.rstrip("\n"),
        FETCH_END,
        ")",
        *TENSOR_PARALLEL,
        serve_command(model.base_model, model.base_revision, model.port, model.name),
        "",
    ])


def vllm_files(manifest: dict) -> dict[str, dict]:
    """The entries of a checkpoint's manifest that make its vLLM export, named as in the export's folder; {} unless
    every file vLLM needs is there, together within MAX_ADAPTER_BYTES (a serving box downloads no more than that)."""
    found = {name.removeprefix("vllm/"): entry for name, entry in manifest.items()
             if name.startswith("vllm/") and name.removeprefix("vllm/") in VLLM_FILES}
    within = sum(entry["size"] for entry in found.values()) <= MAX_ADAPTER_BYTES
    return found if len(found) == len(VLLM_FILES) and within else {}
