"""Downsampling a run's series for its charts, pure over plain values: min/max per bucket, so no spike is lost, and
every phase's first and last point kept (docs/runs.md, "runs/downsample.py")."""

import math
from dataclasses import dataclass

MAX_BUCKETS = 1000  # over the whole run; each bucket gives at most two points per series


def lower(a, b):
    """The smaller of two values, either of which may be missing."""
    return b if a is None else a if b is None else min(a, b)


def higher(a, b):
    """The larger of two values, either of which may be missing."""
    return b if a is None else a if b is None else max(a, b)


def bucket_width(points: int, max_buckets: int = MAX_BUCKETS) -> int:
    """Steps per bucket so that `points` steps make at most `max_buckets` buckets."""
    return max(1, math.ceil(points / max_buckets))


@dataclass(frozen=True)
class Bucket:
    x_first: float
    x_last: float
    low: float | None
    high: float | None


def envelope(buckets: list[Bucket], first: tuple | None = None, last: tuple | None = None) -> tuple[list, list]:
    """Points (xs, ys) through every bucket's minimum and maximum, ordered along the trend so that a smooth series
    draws as a clean line and a noisy one as its band; `first` and `last` (x, y) are kept exactly."""
    # (x_first, x_last, low, high) of the buckets that hold a value: SQL gives both ends or neither
    kept = [(b.x_first, b.x_last, b.low, b.high) for b in buckets if b.low is not None and b.high is not None]
    middles = [(low + high) / 2 for _, _, low, high in kept]
    xs: list[float] = []
    ys: list[float] = []
    if first is not None and first[1] is not None:
        xs.append(first[0])
        ys.append(first[1])
    for i, (x_first, x_last, low, high) in enumerate(kept):
        if low == high or x_first == x_last:
            xs.append(x_last if x_first == x_last else (x_first + x_last) / 2)
            ys.append(high)
            continue
        if i + 1 < len(kept):
            rising = middles[i + 1] >= middles[i]
        else:
            rising = i == 0 or middles[i] >= middles[i - 1]
        xs.extend((x_first, x_last))
        ys.extend((low, high) if rising else (high, low))
    if last is not None and last[1] is not None and (not xs or xs[-1] != last[0] or ys[-1] != last[1]):
        if xs and xs[-1] >= last[0]:  # the last bucket already ends there: its exact value goes last
            while xs and xs[-1] >= last[0]:
                xs.pop()
                ys.pop()
        xs.append(last[0])
        ys.append(last[1])
    return xs, ys


def rounded(values: list, significant: int = 5) -> list:
    """Values to about `significant` digits of the series' largest magnitude: a smaller JSON, the same chart."""
    largest = max((abs(v) for v in values if v is not None), default=0)
    if not largest or not math.isfinite(largest):
        return values
    digits = significant - 1 - math.floor(math.log10(largest))
    return [None if v is None else round(v, digits) for v in values]
