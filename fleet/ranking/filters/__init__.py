"""Hard filters: the offers a run must never land on, each with the reason a user reads. What a user sets is in
settings.py, each filter's test and words in table.py, and the per-offer functions made from them in compiled.py."""

from .compiled import CompiledFilters, compile_filters, exclusion_reasons
from .settings import GPU_TIERS, REGIONS, OfferFilters, parse_version, version_at_least
from .table import BITS, FILTERS, NO_THROUGHPUT, RANKING_BITS, UNBOUNDED_COST, WORDS, Filter, country_code, usd

__all__ = [
    "BITS", "FILTERS", "GPU_TIERS", "NO_THROUGHPUT", "RANKING_BITS", "REGIONS", "UNBOUNDED_COST", "WORDS",
    "CompiledFilters", "Filter", "OfferFilters",
    "compile_filters", "country_code", "exclusion_reasons", "parse_version", "usd", "version_at_least",
]
