"""rank_offers written the slow, obvious way, for the ranking tests to compare with: out of the per-offer calls
(CompiledFilters.check, ThroughputModel.calibrated/estimate, CostModel.estimate/breakdown) and one sort on the full
key. rank_offers' fast paths (one filter function, numpy columns, an argsort, lazy entries) must give the very same
ranking, the same floats included."""

import math
import statistics

from fleet.ranking import SEED_CALIBRATION, CostModel, ThroughputModel, compile_filters, memory
from fleet.ranking.filters import NO_THROUGHPUT, UNBOUNDED_COST
from fleet.ranking.throughput import model_tflops_of

# OfferFilters(**ALL_FILTERS_OFF): every filter that settings can turn off, off.
ALL_FILTERS_OFF = dict(gpu_tiers="any", max_usd_per_hour=None, min_driver_version="", min_cuda=0, min_disk_gb=0,
                       min_inet_down_mbps=0, min_inet_up_mbps=0, min_reliability=0, allow_bids=True, max_gpus=None)


def median_ratio(pairs):
    ratios = [achieved / listed for achieved, listed in pairs if listed > 0]
    return statistics.median(ratios) if ratios else None


def reference_ranking(offers, recipe, filters):
    """([(offer, steps/$, tokens/$, throughput, projection, cost breakdown)] best first, [(offer, reasons)])."""
    compiled = compile_filters(filters, recipe)
    speeds, costs = ThroughputModel(SEED_CALIBRATION, recipe), CostModel(recipe)
    excluded, passed = [], []
    for i, o in enumerate(offers):
        reasons = compiled.check(o)
        if reasons:
            excluded.append((o, reasons))
        else:
            passed.append((i, o, speeds.calibrated(o)))
    measured = [(i, o, t) for i, o, t in passed if t is not None]
    listed, dlperf = {}, {}
    for _, o, t in measured:
        per_gpu = model_tflops_of(t.tokens_per_s / o.num_gpus, recipe)
        if o.total_flops:
            listed.setdefault(o.compute_capability, []).append((per_gpu, o.total_flops / o.num_gpus))
        if o.dlperf:
            dlperf.setdefault(o.compute_capability, []).append((per_gpu, o.dlperf / o.num_gpus))
    any_listed = median_ratio([pair for pairs in listed.values() for pair in pairs])
    any_dlperf = median_ratio([pair for pairs in dlperf.values() for pair in pairs])
    scored = list(measured)
    for i, o, t in passed:
        if t is None:
            cc = o.compute_capability
            t = speeds.estimate(o, median_ratio(listed[cc]) if cc in listed else any_listed,
                                median_ratio(dlperf[cc]) if cc in dlperf else any_dlperf)
            if t is None or not t.tokens_per_s > 0:
                excluded.append((o, compiled.reasons(o, NO_THROUGHPUT)))
            else:
                scored.append((i, o, t))
    rows = []
    steps, tokens_per_step = recipe.total_steps, recipe.tokens_per_step
    for i, o, t in scored:
        plan = memory.plan_on(recipe, o.gpu_ram_gb)  # the memory plan the trainer takes on this card, at its speed
        if plan is not None and plan.speed != 1.0:
            t = t._replace(tokens_per_s=t.tokens_per_s * plan.speed,
                           source=f"{t.source}; x{plan.speed:.2f} for {plan.name}")
        p = costs.estimate(o, tokens_per_step / t.tokens_per_s, o.is_bid)
        total = p.total_usd
        if not total < math.inf:
            excluded.append((o, compiled.reasons(o, UNBOUNDED_COST)))
            continue
        score = steps / total if total > 0 else 0.0
        tokens_per_usd = steps * tokens_per_step / total if total > 0 else 0.0
        rows.append(((-score, total, o.provider, o.offer_id, o.is_bid, i), o, score, tokens_per_usd, t, p))
    rows.sort(key=lambda row: row[0])
    ranked = [(o, score, tokens_per_usd, t, p, costs.breakdown(o, p)) for _, o, score, tokens_per_usd, t, p in rows]
    return ranked, excluded
