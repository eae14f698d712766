"""The address guard judges by its own table of special-purpose ranges, so the interpreter's tables (which changed
across Python versions) neither let an address through nor decide what is refused."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet import addresses


@pytest.mark.parametrize("address, words", [
    ("192.0.0.8", "private"),  # IPv4 dummy address: global to Python 3.11.7's tables
    ("192.0.0.9", "private"),  # the rest of the IETF protocol assignments block
    ("192.0.0.200", "private"),
    ("192.88.99.1", "not a public address"),  # retired 6to4 relay anycast
    ("100.127.255.254", "not a public address"),  # carrier-grade NAT
    ("198.19.0.1", "private"),  # benchmarking
    ("255.255.255.255", "reserved"),
    ("::ffff:192.0.0.8", "192.0.0.8 (inside ::ffff:c000:8) is a private address"),
    ("64:ff9b::192.0.0.8", "192.0.0.8 (inside 64:ff9b::c000:8) is a private address"),
    ("2002:c000:8::1", "192.0.0.8 (inside 2002:c000:8::1) is a private address"),  # 6to4
    ("2001:db8::1", "private"),  # documentation
    ("3fff::1", "private"),  # documentation, newer than some Pythons' tables
    ("2001:3::1", "private"),  # inside 2001::/23
    ("100::1", "reserved"),  # discard-only
    ("5f00::1", "reserved"),  # outside 2000::/3
    ("fec0::1", "site-local"),
])
def test_it_refuses_special_purpose_addresses_whatever_the_interpreter_says(address, words):
    assert words in addresses.address_refusal(address, allow_private=False)


@pytest.mark.parametrize("address", ["8.8.8.8", "192.0.1.1", "2606:4700:4700::1111", "2002:808:808::1"])
def test_it_allows_public_addresses(address):
    assert addresses.address_refusal(address, allow_private=False) == ""


@settings(max_examples=3000, deadline=None)
@given(st.ip_addresses())
def test_nothing_this_interpreter_calls_special_gets_through(ip):
    special = not ip.is_global or any(
        getattr(ip, f"is_{kind}") for kind in ("loopback", "link_local", "reserved", "private", "multicast"))
    if special or getattr(ip, "is_site_local", False):
        assert addresses.address_refusal(str(ip), allow_private=False), ip
    if ip.is_multicast or ip.is_unspecified:
        assert addresses.address_refusal(str(ip), allow_private=True), ip

