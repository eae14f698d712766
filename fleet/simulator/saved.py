"""The marketplace's state file: the instances it rented, the volumes, the offers they hold or lost, the account's
start, the clock and the next instance id, kept across restarts as JSON (written whole, then put in place; one that
cannot be read is set aside with a warning and the marketplace starts afresh)."""

import json
import logging
import os
import time
from dataclasses import fields
from pathlib import Path

from .catalogue import Offer
from .instances import Instance

log = logging.getLogger(__name__)

FORMAT = 1
_PAIRS = ("gpu_intervals", "log_lines")  # lists of tuples, which JSON keeps as lists


def document(*, seed: int, offer_count: int, next_instance_id: int, started_at: float, clock: float,
             offers: list[Offer], instances: list[Instance], volumes=()) -> dict:
    """What the file holds; `clock` is the simulated time at `saved_at`, the real time of writing."""
    return {
        "format": FORMAT,
        "seed": seed,
        "offer_count": offer_count,
        "next_instance_id": next_instance_id,
        "started_at": started_at,
        "clock": clock,
        "saved_at": time.time(),
        "offers_gone": sorted(o.id for o in offers if o.gone),
        "offers_rented": sorted([o.id, o.rented_by] for o in offers if o.rented_by is not None),
        "instances": [{**{f.name: getattr(i, f.name) for f in fields(Instance) if f.name != "offer"},
                       "offer": i.offer.id} for i in instances],
        "volumes": [volume.saved() for volume in volumes],
    }


def write(path: str, doc: dict) -> None:
    temporary = Path(f"{path}.tmp")
    with open(temporary, "w") as out:
        json.dump(doc, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)  # a crash mid-write leaves the last whole file


def read(path: str) -> dict | None:
    """The saved document, or None when there is none or it cannot be read (then it is kept beside as .unreadable)."""
    try:
        doc = json.loads(Path(path).read_text())
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not a format-{FORMAT} state document")
        return doc
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        aside = f"{path}.unreadable"
        try:
            os.replace(path, aside)
        except OSError:
            aside = "(could not be moved)"
        log.warning("simulated marketplace: the state file %s cannot be read (%s); starting afresh with no "
                    "instances, the file kept as %s", path, exc, aside)
        return None


def instances(doc: dict, offers_by_id: dict[int, Offer]) -> list[Instance]:
    """The saved instances on the catalogue's offers; raises KeyError, TypeError or ValueError on a bad entry."""
    restored = []
    for entry in doc["instances"]:
        values = dict(entry)
        values["offer"] = offers_by_id[values["offer"]]
        for name in _PAIRS:
            values[name] = [tuple(pair) for pair in values[name]]
        restored.append(Instance(**values))
    return restored


def clock_now(doc: dict, speed: float) -> float:
    """The simulated time now, had the marketplace gone on running since it wrote the file."""
    return float(doc["clock"]) + max(0.0, time.time() - float(doc["saved_at"])) * speed
