"""Where a stretch of GPU work's peak reserve goes: the CUDA allocator's own record of every block and segment it made
and let go (`torch.cuda.memory._record_memory_history`), replayed to the moment the reserve peaked, and the blocks
alive then summed by the code that asked for them. `bench/train_step.py --memory-history` runs the first optimizer
step (eager warm-up, CUDA-graph capture, the first replays, the optimizer) under it: the step that peaks above the
timed ones."""

import contextlib
from collections import defaultdict

GIB = 2**30
# The events that map memory into the reserve (+1) and back out (-1): a segment, or with expandable segments a range
# of one.
RESERVE_SIGN = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
# A block's owner: the innermost frame in these, or failing that the innermost frame outside torch.
OWNERS = ("/training/", "/bench/", "/fla/", "/transformers/", "/peft/")


def owner(frames) -> str:
    """The code a block is charged to: "file:line function" of its innermost frame in the project or a model library,
    else of its innermost frame outside torch, else "unknown" (no Python frame was recorded)."""
    frames = list(frames or ())
    outside_torch = [f for f in frames if "/torch/" not in f.get("filename", "")]
    mine = [f for f in frames if any(part in f.get("filename", "") for part in OWNERS)]
    chosen = (mine or outside_torch or [None])[0]
    if chosen is None:
        return "unknown"
    path = chosen.get("filename", "?")
    for part in OWNERS:
        if part in path:
            path = part.strip("/") + "/" + path.split(part, 1)[1]
            break
    return f"{path}:{chosen.get('line', '?')} {chosen.get('name', '?')}"


def summary(events, reserved_before: int, allocated_before: int, top: int = 10) -> dict:
    """From the allocator's trace (dicts with action, addr, size, frames; innermost frame first): the peak reserve,
    what was allocated then (before the record began, and since, by owner, the largest `top`), and the reserve's part
    that no block used (cached)."""
    reserved, peak, at = reserved_before, reserved_before, -1
    for index, event in enumerate(events):
        reserved += RESERVE_SIGN.get(event.get("action"), 0) * event.get("size", 0)
        if reserved > peak:
            peak, at = reserved, index
    live: dict[int, dict] = {}
    for event in events[:at + 1]:
        action = event.get("action")
        if action == "alloc":
            live[event["addr"]] = event
        elif action == "free_completed":
            live.pop(event["addr"], None)
    by_owner: dict[str, list] = defaultdict(lambda: [0, 0])
    for event in live.values():
        entry = by_owner[owner(event.get("frames"))]
        entry[0] += event["size"]
        entry[1] += 1
    since = sum(size for size, _ in by_owner.values())
    largest = sorted(by_owner.items(), key=lambda item: -item[1][0])[:top]
    return {
        "events": len(events), "peak_at_event": at,
        "peak_reserved_gib": round(peak / GIB, 2),
        "allocated_before_gib": round(allocated_before / GIB, 2),
        "allocated_since_gib": round(since / GIB, 2),
        "cached_unused_gib": round((peak - allocated_before - since) / GIB, 2),
        "largest": [{"owner": name, "gib": round(size / GIB, 3), "blocks": count}
                    for name, (size, count) in largest],
    }


@contextlib.contextmanager
def recorded(result: dict, max_entries: int = 2_000_000):
    """Record the allocator's events inside the block; after it, result["memory_history"] is `summary` of them (None
    off a GPU). The record keeps the last `max_entries` events: a summary whose events reach it began late."""
    import torch

    if not torch.cuda.is_available():
        result["memory_history"] = None
        yield
        return
    torch.cuda.synchronize()
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        yield
    finally:
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        events = snapshot["device_traces"][torch.cuda.current_device()]
        result["memory_history"] = {**summary(events, reserved, allocated), "max_entries": max_entries}
