"""Runs on a serving box before vLLM starts, on the standard library alone: fetches the adapter's files through its read
grant, checks each against the manifest, prints the --max-lora-rank vLLM needs."""

import hashlib
import json
import os
import shutil
import sys
import urllib.request
from pathlib import Path

GRANT_ENV = "FLEET_ADAPTER"  # what the box was rented with, not a setting of the dashboard
RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the --max-lora-rank values vLLM accepts (its MaxLoRARanks)
CHUNK = 1 << 20


def copy(grant, name, out, size):
    """The sha256 of the file copied, refused past `size` (its manifest's): the store may hold anything."""
    if grant["kind"] == "local":
        source = open(os.path.join(grant["path"], name), "rb")
    elif grant["kind"] == "s3-get":
        source = urllib.request.urlopen(grant["files"][name], timeout=120)  # noqa: S310 (a presigned https URL)
    else:
        raise ValueError(f"the grant's kind {grant['kind']!r} is not local or s3-get")
    sha = hashlib.sha256()
    with source:
        while block := source.read(CHUNK):
            size -= len(block)
            if size < 0:
                raise ValueError(f"{name} is larger than its manifest says")
            sha.update(block)
            out.write(block)
    return sha.hexdigest()


def fetch(folder, grant, manifest):
    """The adapter's rank, once every file is in the folder as the manifest says; ValueError or OSError otherwise."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, entry in sorted(manifest.items()):
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"{name!r} is not a plain file name")
        part = folder / (name + ".part")
        with open(part, "wb") as out:
            sha = copy(grant, name, out, entry["size"])
        size = part.stat().st_size
        if size != entry["size"] or sha != entry["sha256"]:
            raise ValueError(f"{name} is {size} bytes with sha256 {sha}; its checkpoint's manifest says "
                             f"{entry['size']} bytes with sha256 {entry['sha256']}")
        part.rename(folder / name)
    return int(json.loads((folder / "adapter_config.json").read_text())["r"])


def main(argv):
    folder = Path(argv[1])
    try:
        parts = int(os.environ[GRANT_ENV + "_PARTS"])
        spec = json.loads("".join(os.environ[f"{GRANT_ENV}_{i}"] for i in range(parts)))
        rank = fetch(folder, spec["grant"], spec["manifest"])
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a URL is never in these messages, only the file name
        shutil.rmtree(folder, ignore_errors=True)
        print(f"adapter: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(next((r for r in RANKS if r >= rank), RANKS[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
