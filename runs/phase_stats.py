"""What each phase of a run did, folded from its bucket rows, and the zero-gradient check, pure over plain values."""

from dataclasses import dataclass
from datetime import datetime

from runs.downsample import higher, lower


@dataclass(frozen=True)
class PhaseStats:
    index: int
    name: str
    kind: str
    planned_steps: int
    points: int = 0
    first_step: int | None = None
    last_step: int | None = None
    first_at: datetime | None = None
    last_at: datetime | None = None
    routed_grad_points: int = 0
    max_grad_routed: float | None = None
    b_zero_points: int = 0
    min_b_zero: int | None = None
    max_b_zero: int | None = None

    @property
    def step_span(self) -> tuple[int, int]:
        """(first_step, last_step) of a phase that reported points."""
        if self.first_step is None or self.last_step is None:
            raise ValueError(f"phase {self.index} reported no step")
        return self.first_step, self.last_step


def zero_gradient_phases(stats: list[PhaseStats]) -> list[str]:
    """Why each phase that trained with the routed-expert LoRA's gradient at zero is suspect, in the user's words:
    its routed gradient norm was exactly 0 at every step, or its count of routed B matrices still at zero never
    moved from a first value above 0 (B starts at zero and any gradient moves it)."""
    found = []
    for p in stats:
        label = f"Phase {p.index} ({p.name})"
        if p.routed_grad_points and p.max_grad_routed == 0:
            found.append(f"{label}: the routed-expert LoRA gradient norm is exactly 0 at all "
                         f"{p.routed_grad_points} steps reported; the routed experts are not training.")
        elif p.b_zero_points >= 2 and p.min_b_zero == p.max_b_zero and (p.min_b_zero or 0) > 0:
            found.append(f"{label}: {p.min_b_zero} routed LoRA B matrices stayed at zero through "
                         f"{p.b_zero_points} steps; the routed experts get no gradient.")
    return found


def phase_stats(phases: list[tuple], rows: list[dict]) -> list[PhaseStats]:
    """Per-phase counts and the zero-gradient figures, folded from the bucket rows of `bucket_rows` (so the run's
    points are scanned once). `phases` are (index, name, kind, planned steps)."""
    folded: dict[int, dict] = {}
    for r in rows:
        f = folded.get(r["phase"])
        if f is None:
            folded[r["phase"]] = {"points": r["points"], "first_step": r["x_first"], "last_step": r["x_last"],
                                  "routed_grad_points": r["grad_norm_routed_points"],
                                  "max_grad_routed": r["grad_norm_routed_high"],
                                  "b_zero_points": r["routed_b_zero_points"], "min_b_zero": r["routed_b_zero_low"],
                                  "max_b_zero": r["routed_b_zero_high"]}
            continue
        f["points"] += r["points"]
        f["first_step"], f["last_step"] = min(f["first_step"], r["x_first"]), max(f["last_step"], r["x_last"])
        f["routed_grad_points"] += r["grad_norm_routed_points"]
        f["b_zero_points"] += r["routed_b_zero_points"]
        f["max_grad_routed"] = higher(f["max_grad_routed"], r["grad_norm_routed_high"])
        f["min_b_zero"] = lower(f["min_b_zero"], r["routed_b_zero_low"])
        f["max_b_zero"] = higher(f["max_b_zero"], r["routed_b_zero_high"])
    stats = [PhaseStats(index=i, name=n, kind=k, planned_steps=steps, **folded.pop(i, {})) for i, n, k, steps in phases]
    # Points of a phase the run does not list (a recipe edited by hand) still show.
    stats += [PhaseStats(index=i, name=f"phase {i}", kind="", planned_steps=f["last_step"], **f)
              for i, f in sorted(folded.items())]
    return stats
