"""What a user sets to rule offers out (OfferFilters), checked and normalised the same way from code, a saved
profile or the Offers form."""

import math
from dataclasses import dataclass, field, fields
from decimal import Decimal, InvalidOperation

from ..values import number, whole

# Per-GPU memory ranges, matched on memory because marketplaces name the same card several ways.
GPU_TIERS: dict[str, tuple[str, float, float]] = {
    "rtx_pro_6000": ("RTX PRO 6000", 90.0, 100.0),
    "h200": ("H200", 130.0, 150.0),
    "b200": ("B200", 170.0, 190.0),
}
_TIER_ALIASES = {"h200_nvl": "h200", "rtx_pro_6000_ws": "rtx_pro_6000", "rtx_pro_6000_blackwell": "rtx_pro_6000"}

# Regions near a checkpoint bucket, as country codes (vast.ai geolocation ends with one).
REGIONS: dict[str, frozenset[str]] = {
    "EU": frozenset(
        "AT BE BG HR CY CZ DK EE FI FR DE GR HU IE IT LV LT LU MT NL PL PT RO SK SI ES SE IS LI NO CH GB".split()
    ),
    "NA": frozenset("US CA MX".split()),
    "APAC": frozenset("JP KR SG TW HK AU NZ IN".split()),
}

_ANY = ("any", "*", "")


@dataclass(frozen=True)
class OfferFilters:
    gpu_tiers: tuple[str, ...] = ("rtx_pro_6000", "h200", "b200")  # () = any tier
    vram_min_gb: float | None = None  # set either bound: an explicit range that replaces the tiers
    vram_max_gb: float | None = None
    max_usd_per_hour: Decimal | None = Decimal("1.30")  # on the rental's $/h (machine and rented disk); None = no cap
    min_driver_version: str = "570"  # the worker image's CUDA 12.8 needs driver >= 570
    min_cuda: float = 12.8  # compared with the offer's cuda_max
    min_disk_gb: float = 250.0
    min_inet_down_mbps: float = 250.0
    min_inet_up_mbps: float = 200.0
    locations: frozenset[str] = field(default_factory=frozenset)  # country codes and/or regions; empty = any
    # vast.ai's geolocation notin: country codes and/or regions kept out (checked after `locations`)
    excluded_locations: frozenset[str] = field(default_factory=frozenset)
    min_reliability: float = 0.95
    require_verified: bool = False
    allow_bids: bool = False
    min_gpus: int = 1
    max_gpus: int | None = 1  # None = no maximum
    datacenter_only: bool = False  # vast.ai's datacenter=true: hosts in a datacenter (hosting_type 1)
    min_gpu_mem_bw_gb_s: float = 0.0  # vast.ai's gpu_mem_bw, each GPU's memory bandwidth; 0 = any

    def __post_init__(self):
        # Normalise here too, so filters built in code are checked exactly like a saved profile.
        set_ = object.__setattr__
        set_(self, "gpu_tiers", _tiers(self.gpu_tiers))
        set_(self, "vram_min_gb", _optional_number("vram_min_gb", self.vram_min_gb))
        set_(self, "vram_max_gb", _optional_number("vram_max_gb", self.vram_max_gb))
        if self.vram_min_gb is not None and self.vram_max_gb is not None and self.vram_min_gb > self.vram_max_gb:
            raise ValueError(f"vram_min_gb {self.vram_min_gb:g} is above vram_max_gb {self.vram_max_gb:g}")
        set_(self, "max_usd_per_hour", _optional_money("max_usd_per_hour", self.max_usd_per_hour))
        version = str(self.min_driver_version).strip()
        if version and parse_version(version) is None:
            raise ValueError(f"min_driver_version must look like 570 or 570.124.06, got {self.min_driver_version!r}")
        set_(self, "min_driver_version", version)
        for name in ("min_cuda", "min_disk_gb", "min_inet_down_mbps", "min_inet_up_mbps", "min_gpu_mem_bw_gb_s"):
            set_(self, name, _number(name, getattr(self, name)))
        reliability = _number("min_reliability", self.min_reliability)
        if reliability > 1:
            raise ValueError(f"min_reliability must be between 0 and 1, got {self.min_reliability!r}")
        set_(self, "min_reliability", reliability)
        set_(self, "locations", _locations(self.locations))
        set_(self, "excluded_locations", _locations(self.excluded_locations, "excluded_locations"))
        for name in ("require_verified", "allow_bids", "datacenter_only"):
            set_(self, name, _flag(name, getattr(self, name)))
        set_(self, "min_gpus", _count("min_gpus", self.min_gpus))
        if self.max_gpus is None or self.max_gpus == "":
            set_(self, "max_gpus", None)
        else:
            set_(self, "max_gpus", _count("max_gpus", self.max_gpus))
            if self.max_gpus < self.min_gpus:
                raise ValueError(f"max_gpus {self.max_gpus} is below min_gpus {self.min_gpus}")

    def to_dict(self) -> dict:
        """JSON-ready: money as a string, sets as sorted lists."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(gpu_tiers=list(self.gpu_tiers), locations=sorted(self.locations),
                    excluded_locations=sorted(self.excluded_locations),
                    max_usd_per_hour=None if self.max_usd_per_hour is None else str(self.max_usd_per_hour))
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "OfferFilters":
        """Missing keys take their defaults; unknown keys and bad values raise ValueError naming the field."""
        if not isinstance(data, dict):
            raise ValueError(f"filters must be a mapping, got {type(data).__name__}")  # noqa: TRY004 (callers catch ValueError)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown filter(s): {', '.join(unknown)}")
        return cls(**data)

    @property
    def vram_ranges(self) -> tuple[tuple[float, float], ...]:
        if self.vram_min_gb is not None or self.vram_max_gb is not None:
            low = self.vram_min_gb if self.vram_min_gb is not None else 0.0
            high = self.vram_max_gb if self.vram_max_gb is not None else math.inf
            return ((low, high),)
        return tuple((GPU_TIERS[t][1], GPU_TIERS[t][2]) for t in self.gpu_tiers)

    @property
    def allowed_countries(self) -> frozenset[str]:
        return _countries(self.locations)

    @property
    def excluded_countries(self) -> frozenset[str]:
        return _countries(self.excluded_locations)


def _countries(items: frozenset[str]) -> frozenset[str]:
    countries: set[str] = set()
    for item in items:
        countries |= REGIONS.get(item, {item})
    return frozenset(countries)


def parse_version(text: str) -> tuple[int, ...] | None:
    """"535.129.03" -> (535, 129, 3); None when it is blank or not dotted numbers."""
    parts = text.strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def version_at_least(version: tuple[int, ...], needed: tuple[int, ...]) -> bool:
    # Part by part, missing parts count as zero: "570" == "570.0.0" < "570.124".
    width = max(len(version), len(needed))
    return version + (0,) * (width - len(version)) >= needed + (0,) * (width - len(needed))


def _tiers(value) -> tuple[str, ...]:
    if value is None or (isinstance(value, str) and value.strip().lower() in _ANY):
        return ()
    if isinstance(value, str):
        value = [value]
    try:
        items = list(value)
    except TypeError:
        raise ValueError(f"gpu_tiers must be a list of tier names or 'any', got {value!r}") from None
    tiers = []
    for item in items:
        key = str(item).strip().lower().replace(" ", "_").replace("-", "_")
        if key in _ANY:
            return ()
        key = _TIER_ALIASES.get(key, key)
        if key not in GPU_TIERS:
            raise ValueError(f"gpu_tiers: unknown tier {item!r} (known: {', '.join(GPU_TIERS)}, or 'any')")
        if key not in tiers:
            tiers.append(key)
    return tuple(tiers)


def _locations(value, name: str = "locations") -> frozenset[str]:
    if value is None or (isinstance(value, str) and value.strip().lower() in _ANY):
        return frozenset()
    if isinstance(value, str):
        value = value.split(",")
    try:
        items = list(value)
    except TypeError:
        raise ValueError(f"{name} must be a list of country codes or regions, got {value!r}") from None
    result = set()
    for item in items:
        code = str(item).strip().upper()
        if code.lower() in _ANY:
            return frozenset()
        if code in REGIONS or (len(code) == 2 and code.isalpha()):
            result.add(code)
        else:
            raise ValueError(
                f"{name}: {item!r} is neither a two-letter country code nor a region ({', '.join(REGIONS)})")
    return frozenset(result)


def _number(name, value) -> float:
    return number(name, value, non_negative=True)


def _optional_number(name, value) -> float | None:
    return None if value is None or value == "" else _number(name, value)


def _optional_money(name, value) -> Decimal | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an amount in dollars like '1.30', got {value!r}")  # noqa: TRY004
    if isinstance(value, float):  # accepted from JSON forms, through its shortest text, never its binary value
        value = repr(value)
    try:
        amount = Decimal(str(value).strip().lstrip("$"))
    except InvalidOperation:
        raise ValueError(f"{name} must be an amount in dollars like '1.30', got {value!r}") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"{name} must be an amount >= 0, got {value!r}")
    return amount


def _flag(name, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "0", "no", "off", ""):
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be true or false, got {value!r}")


def _count(name, value) -> int:
    try:
        count = whole(name, value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return count
