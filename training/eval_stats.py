"""An evaluation's numbers from its per-sample scores, and the recipe's promote rule over them; plain Python, no torch
and no Django, so the dashboard and the box compute them the same way (docs/runs.md, "Evaluation")."""

import math
import random

DEFAULT_RESAMPLES = 2000
METRICS = ("adapter_score", "difference")  # what a promote rule names as the number a run is judged and ranked by


def _percentile(sorted_values: list[float], fraction: float) -> float:
    """The value at `fraction` of the way through sorted values, interpolated linearly between neighbours."""
    position = fraction * (len(sorted_values) - 1)
    below = math.floor(position)
    above = min(below + 1, len(sorted_values) - 1)
    return sorted_values[below] + (sorted_values[above] - sorted_values[below]) * (position - below)


def _check_scores(name: str, scores: list[float]) -> None:
    for index, score in enumerate(scores):
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score) \
                or not 0.0 <= score <= 1.0:
            raise ValueError(f"{name} score of sample {index} is {score!r}; a score is a number from 0 to 1")


def summarize(base: list[float], adapter: list[float], seed: int = 0,
              resamples: int = DEFAULT_RESAMPLES) -> dict:
    """Mean scores with and without the adapter over the same samples, their difference with a 95% paired-bootstrap
    percentile interval (the same samples drawn for both, `resamples` times, seeded), and the wins, ties and losses
    of the adapter sample by sample."""
    if len(base) != len(adapter):
        raise ValueError(f"{len(base)} base scores but {len(adapter)} adapter scores; each sample has both")
    if not base:
        raise ValueError("no samples to summarize")
    if resamples < 1:
        raise ValueError("resamples must be at least 1")
    _check_scores("base", base)
    _check_scores("adapter", adapter)
    n = len(base)
    differences = [a - b for a, b in zip(adapter, base, strict=True)]
    rng = random.Random(seed)
    means = sorted(math.fsum(rng.choices(differences, k=n)) / n for _ in range(resamples))
    return {
        "n": n,
        "base_score": math.fsum(base) / n,
        "adapter_score": math.fsum(adapter) / n,
        "difference": math.fsum(differences) / n,
        "ci_low": _percentile(means, 0.025),
        "ci_high": _percentile(means, 0.975),
        "wins": sum(1 for d in differences if d > 0),
        "ties": sum(1 for d in differences if d == 0),
        "losses": sum(1 for d in differences if d < 0),
    }


def promoted(summary: dict, rule: dict | None) -> tuple[bool, str]:
    """Whether the run is promoted by the recipe's rule (gain over the base >= min_gain, and adapter score >=
    min_score when set), with the reason in words; no rule promotes nothing."""
    if not rule:
        return False, "the recipe has no promote rule"
    min_gain = float(rule.get("min_gain", 0.0))
    min_score = rule.get("min_score")
    gain = summary["adapter_score"] - summary["base_score"]
    if gain < min_gain:
        return False, f"gain over the base {gain:+.4f} is below the required {min_gain:+.4f}"
    if min_score is not None and summary["adapter_score"] < float(min_score):
        return False, f"adapter score {summary['adapter_score']:.4f} is below the required {float(min_score):.4f}"
    words = f"gain over the base {gain:+.4f} >= {min_gain:+.4f}"
    if min_score is not None:
        words += f" and adapter score {summary['adapter_score']:.4f} >= {float(min_score):.4f}"
    return True, words
