"""FILTERS turned into two plain functions per filters-and-recipe pair (`first_failed`, `mask`), compiled once from the
entries' tests (docs/fleet.md, "fleet/ranking/filters/compiled.py")."""

import linecache
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from fleet.providers.records import OfferRecord

from ..workload import Workload
from .settings import OfferFilters
from .table import FILTERS, TEST_NAMES, WORDS, Filter


def _check_table(table: tuple[Filter, ...]) -> None:
    """Each test is an expression; an entry given another comes right below it or its other entries, and that one
    is given none (the functions nest them one level deep)."""
    given_none = {entry.name for entry in table if not entry.given}
    for above, entry in zip((None, *table), table, strict=False):
        compile(entry.test, entry.name, "eval")
        if entry.given and not (entry.given in given_none and above and entry.given in (above.name, above.given)):
            raise ValueError(f"filter {entry.name} is given {entry.given!r}: it must come right below that entry or "
                             f"its other entries, and that entry given none")


_check_table(FILTERS)


def _applies(f: OfferFilters, r: Workload) -> int:
    """A bit for each entry that can exclude something under these settings; one given an entry that is off is off."""
    on, names = 0, set()
    for i, entry in enumerate(FILTERS):
        if (not entry.given or entry.given in names) and entry.when(f, r):
            on |= 1 << i
            names.add(entry.name)
    return on


def _source(on: int, first: bool) -> list[str]:
    """The lines of `first_failed` (each failed test returns its bit) or `mask` (each ORs in its bit)."""
    lines = ["    def first_failed(o):" if first else "    def mask(o):"]
    if not first:
        lines.append("        failed = 0")
    entries = [(1 << i, entry) for i, entry in enumerate(FILTERS) if on >> i & 1]
    for place, (bit, entry) in enumerate(entries):
        # After a failed "... unknown" test, `mask` skips the entries given it; `first_failed` has returned.
        indent = " " * (12 if entry.given and not first else 8)
        if entry.reads:
            lines.append(indent + entry.reads)
        lines += [f"{indent}if {entry.test}:", f"{indent}    {'return' if first else 'failed |='} {bit}"]
        following = entries[place + 1][1] if place + 1 < len(entries) else None
        if not first and following is not None and following.given == entry.name:
            lines.append(indent + "else:")
    lines.append("        return 0" if first else "        return failed")
    return lines


@lru_cache(maxsize=64)
def _maker(on: int, bound: tuple[str, ...]) -> Callable:
    """A function of the bound names that returns (first_failed, mask) for the entries `on`."""
    source = "\n".join([f"def make({', '.join(bound)}):", *_source(on, True), *_source(on, False),
                        "    return first_failed, mask", ""])
    filename = f"<offer filters {on:#x}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # for tracebacks
    namespace: dict[str, Any] = dict(TEST_NAMES)
    exec(compile(source, filename, "exec"), namespace)
    return namespace["make"]


class CompiledFilters:
    """The filters bound to one filters-and-recipe pair.

    `first_failed(offer)` is the ranking's hot path: the bit of the first filter the offer fails, 0 when it passes.
    `mask(offer)` has a bit for every filter it fails, and `reasons(offer, mask)` turns them into words.
    """

    def __init__(self, filters: OfferFilters, recipe: Workload):
        self.filters = filters
        self.recipe = recipe
        on = _applies(filters, recipe)
        bound: dict = {}
        for i, entry in enumerate(FILTERS):
            if on >> i & 1:
                names = entry.binds(filters, recipe)
                if names.keys() & bound.keys():
                    raise ValueError(f"filter {entry.name} binds {sorted(names.keys() & bound.keys())} again")
                bound.update(names)
        self.first_failed: Callable[[OfferRecord], int]
        self.mask: Callable[[OfferRecord], int]
        self.first_failed, self.mask = _maker(on, tuple(bound))(**bound)

    def check(self, offer: OfferRecord) -> tuple[str, ...]:
        """Every reason the offer is excluded; () when it passes."""
        return self.reasons(offer, self.mask(offer))

    def reasons(self, o: OfferRecord, mask: int) -> tuple[str, ...]:
        words = []
        bit = 1
        while bit <= mask:
            if mask & bit:
                words.append(WORDS[bit](o, self.filters, self.recipe))
            bit <<= 1
        return tuple(words)


def compile_filters(filters: OfferFilters, recipe: Workload) -> CompiledFilters:
    return CompiledFilters(filters, recipe)


def exclusion_reasons(offer: OfferRecord, filters: OfferFilters, recipe: Workload | None = None) -> tuple[str, ...]:
    """Every reason the filters exclude one offer (() when it passes); for a page that looks one offer up."""
    return CompiledFilters(filters, recipe or Workload()).check(offer)
