"""rank_offers: which offer runs this recipe for the fewest dollars, and why every other offer does not.

Score is steps per dollar of the whole run: the recipe's steps over its expected total cost on the offer (cost.py),
which is throughput (throughput.py) over the full hourly cost with start-up, traffic and expected restarts spread
over the run. Ranking on the listed $/h alone is what put runs on hosts that were cheap and then failed; here the
filters drop what cannot work at all, and the cost model prices what works badly.

Pure and fast: plain records in, plain records out, no database or network, so the Offers page, a Celery task and
the rank_offers command share it. The scoring pass is floats; the Decimal money of a ranked offer, the words of an
exclusion and the "why" lines are worked out when something reads them, so 10,000 offers cost a few milliseconds.
"""

import math
from dataclasses import dataclass
from decimal import Decimal

from fleet.providers.records import OfferRecord

from .cost import CostBreakdown, CostModel, Projection
from .filters import NO_THROUGHPUT, UNBOUNDED_COST, CompiledFilters, OfferFilters, compile_filters, usd
from .recipe import Recipe
from .throughput import SEED_CALIBRATION, Calibration, Throughput, ThroughputModel, anchor_ratio, model_tflops_of


class RankedOffer:
    """One offer that passed, with its score and projection. Immutable by convention; the Decimal money (`cost`)
    is worked out on first read, so ranking 10,000 offers pays for it only on the ones a page shows."""

    __slots__ = ("offer", "rank", "steps_per_usd", "tokens_per_usd", "throughput", "projection", "_costs", "_cost")

    def __init__(self, offer, rank, steps_per_usd, tokens_per_usd, throughput, projection, costs):
        self.offer: OfferRecord = offer
        self.rank: int = rank  # 1 = best
        self.steps_per_usd: float = steps_per_usd
        self.tokens_per_usd: float = tokens_per_usd
        self.throughput: Throughput = throughput
        self.projection: Projection = projection
        self._costs = costs
        self._cost = None

    def __repr__(self):
        o = self.offer
        return (f"<RankedOffer #{self.rank} {o.provider}:{o.offer_id} {o.gpu_name} "
                f"{self.steps_per_usd:.1f} steps/$>")

    @property
    def cost(self) -> CostBreakdown:
        if self._cost is None:
            self._cost = self._costs.breakdown(self.offer, self.projection)
        return self._cost

    @property
    def total_usd(self) -> Decimal:
        return self.cost.total_usd

    @property
    def usd_per_hour(self) -> Decimal:
        return self.cost.usd_per_hour

    @property
    def wall_hours(self) -> float:
        return self.projection.wall_hours

    @property
    def tokens_per_s(self) -> float:
        return self.throughput.tokens_per_s

    @property
    def step_s(self) -> float:
        return self.projection.step_s

    @property
    def kernel_path(self) -> str:
        return self.throughput.kernel_path

    @property
    def estimated(self) -> bool:
        """The throughput is a spec-sheet estimate, not a measurement."""
        return self.throughput.estimated

    @property
    def interruptible(self) -> bool:
        """A bid rental: the marketplace may reclaim it."""
        return self.offer.is_bid

    @property
    def why(self) -> tuple[str, ...]:
        o, p, c, t = self.offer, self.projection, self.cost, self.throughput
        lines = [
            f"{t.tokens_per_s:,.0f} tok/s, {p.step_s:.0f} s/step ({t.source})",
            f"{usd(o.gpu_usd_per_hour or o.total_usd_per_hour)}/h listed GPU; {usd(c.usd_per_hour)}/h all-in "
            f"over {p.wall_hours:.1f} h",
            f"start-up {p.startup_s / 60:.0f} min billed ({usd(c.startup_usd)}); traffic {usd(c.download_usd)} model "
            f"download + {usd(c.upload_usd)} for {p.checkpoints} checkpoints",
        ]
        if p.expected_restarts:
            lines.append(
                f"reliability {o.reliability:.3f}: {p.expected_restarts:.2f} expected restarts ({usd(c.restart_usd)})")
        if o.is_bid:
            lines.append("interruptible (bid): may be reclaimed mid-phase; fine for smoke tests")
        if t.estimated:
            lines.append("throughput is an estimate: no run has measured this GPU")
        return tuple(lines)


class Exclusion:
    """One offer that did not pass; `reasons` holds every filter that excludes it, in filter order."""

    __slots__ = ("offer", "mask", "_filters")

    def __init__(self, offer: OfferRecord, mask: int, filters: CompiledFilters):
        self.offer = offer
        self.mask = mask  # one bit per reason, see filters.py
        self._filters = filters

    @property
    def reasons(self) -> tuple[str, ...]:
        return self._filters.reasons(self.offer, self.mask)

    def __repr__(self):
        return f"<Exclusion {self.offer.provider}:{self.offer.offer_id} {'; '.join(self.reasons)}>"


@dataclass(frozen=True)
class Ranking:
    entries: tuple[RankedOffer, ...]  # best first
    excluded: tuple[Exclusion, ...]  # in the order the offers came
    recipe: Recipe
    filters: OfferFilters

    def find(self, offer_id: str, *, provider: str | None = None, is_bid: bool | None = None):
        """The RankedOffer or Exclusion for one offer, or None if it was not in the catalogue."""
        for item in (*self.entries, *self.excluded):
            o = item.offer
            if o.offer_id == offer_id and (provider is None or o.provider == provider) \
                    and (is_bid is None or o.is_bid == is_bid):
                return item
        return None

    def to_dict(self, limit: int | None = None) -> dict:
        """JSON-ready summary for the command line and the API; money as strings."""
        entries = self.entries if limit is None else self.entries[:limit]
        return {
            "recipe": self.recipe.to_dict(),
            "filters": self.filters.to_dict(),
            "ranked": [
                {
                    "rank": e.rank,
                    "provider": e.offer.provider,
                    "offer_id": e.offer.offer_id,
                    "gpu_name": e.offer.gpu_name,
                    "num_gpus": e.offer.num_gpus,
                    "steps_per_usd": round(e.steps_per_usd, 3),
                    "tokens_per_usd": round(e.tokens_per_usd),
                    "wall_hours": round(e.wall_hours, 2),
                    "total_usd": str(e.total_usd),
                    "usd_per_hour": str(e.usd_per_hour),
                    "estimated": e.estimated,
                    "interruptible": e.interruptible,
                    "why": list(e.why),
                }
                for e in entries
            ],
            "excluded": [
                {"provider": x.offer.provider, "offer_id": x.offer.offer_id, "is_bid": x.offer.is_bid,
                 "reasons": list(x.reasons)}
                for x in self.excluded
            ],
        }


def rank_offers(
    offers,
    recipe: Recipe | None = None,
    filters: OfferFilters | None = None,
    *,
    calibration: Calibration | None = None,
) -> Ranking:
    """Every offer either ranked (best steps per dollar first) or excluded with all of its reasons.

    recipe and filters default to the product's defaults; calibration to the seeded throughput table.
    """
    recipe = recipe or Recipe()
    filters = filters or OfferFilters()
    compiled = compile_filters(filters, recipe)
    mask = compiled.mask
    speeds = ThroughputModel(calibration or SEED_CALIBRATION, recipe)
    costs = CostModel(recipe)
    calibrated = speeds.calibrated
    estimate_cost = costs.estimate
    tokens_per_step = recipe.tokens_per_step
    steps = recipe.total_steps

    excluded = []
    # (-score, total_usd, provider, offer_id, is_bid, arrival, offer, throughput, projection): sorting the tuples
    # themselves is the ranking order (best score, then the cheaper run, then a stable id), with no key function.
    scored = []
    uncalibrated = []
    for i, o in enumerate(offers):
        m = mask(o)
        if m:
            excluded.append(Exclusion(o, m, compiled))
            continue
        t = calibrated(o)
        if t is None:
            uncalibrated.append((i, o))
            continue
        p = estimate_cost(o, tokens_per_step / t.tokens_per_s, o.is_bid)
        total = p.total_usd
        scored.append((-steps / total if total > 0 else 0.0, total, o.provider, o.offer_id, o.is_bid, i, o, t, p))

    if uncalibrated:
        # Anchor spec-sheet figures on what calibrated offers in this same catalogue list, whatever unit the
        # marketplace uses for total_flops and dlperf; per architecture where one is calibrated, because the kernel
        # path (and so the achieved share of the listed figure) follows the architecture.
        listed_pairs, dlperf_pairs = {}, {}
        for *_, o, t, _ in scored:
            if not t.estimated:
                per_gpu = model_tflops_of(t.tokens_per_s / o.num_gpus, recipe)
                if o.total_flops:
                    listed_pairs.setdefault(o.compute_capability, []).append((per_gpu, o.total_flops / o.num_gpus))
                if o.dlperf:
                    dlperf_pairs.setdefault(o.compute_capability, []).append((per_gpu, o.dlperf / o.num_gpus))
        listed_ratio = {cc: anchor_ratio(pairs) for cc, pairs in listed_pairs.items()}
        dlperf_ratio = {cc: anchor_ratio(pairs) for cc, pairs in dlperf_pairs.items()}
        any_listed = anchor_ratio([pair for pairs in listed_pairs.values() for pair in pairs])
        any_dlperf = anchor_ratio([pair for pairs in dlperf_pairs.values() for pair in pairs])
        for i, o in uncalibrated:
            cc = o.compute_capability
            t = speeds.estimate(o, listed_ratio.get(cc, any_listed), dlperf_ratio.get(cc, any_dlperf))
            if t is None or not t.tokens_per_s > 0:
                excluded.append(Exclusion(o, NO_THROUGHPUT, compiled))
                continue
            p = estimate_cost(o, tokens_per_step / t.tokens_per_s, o.is_bid)
            total = p.total_usd
            scored.append((-steps / total if total > 0 else 0.0, total, o.provider, o.offer_id, o.is_bid, i, o, t, p))

    finite = []
    for item in scored:
        if item[1] < math.inf:  # also false for NaN
            finite.append(item)
        else:
            excluded.append(Exclusion(item[6], UNBOUNDED_COST, compiled))
    finite.sort()

    tokens_per_run = steps * tokens_per_step
    entries = tuple([
        RankedOffer(o, rank, -negative_score, tokens_per_run / total if total > 0 else 0.0, t, p, costs)
        for rank, (negative_score, total, _, _, _, _, o, t, p) in enumerate(finite, 1)
    ])
    return Ranking(entries, tuple(excluded), recipe, filters)
