"""Ranking marketplace offers for a fine-tune by steps per dollar of the whole run. Pure: no Django, no I/O."""

from .cost import CostBreakdown, CostModel, OfferPrices, Projection, offer_prices
from .filters import GPU_TIERS, REGIONS, OfferFilters, compile_filters, exclusion_reasons
from .rank import Exclusion, RankedOffer, Ranking, best_offer, rank_offers
from .throughput import SEED_CALIBRATION, Calibration, CalibrationEntry, ThroughputModel, record_step_time
from .workload import PRESETS, Phase, Workload, micro_step_vram_gb

__all__ = [
    "GPU_TIERS", "PRESETS", "REGIONS", "SEED_CALIBRATION",
    "Calibration", "CalibrationEntry", "CostBreakdown", "CostModel", "Exclusion", "OfferFilters", "OfferPrices",
    "Phase", "Projection", "RankedOffer", "Ranking", "ThroughputModel", "Workload",
    "best_offer", "compile_filters", "exclusion_reasons", "micro_step_vram_gb", "offer_prices", "rank_offers",
    "record_step_time",
]
