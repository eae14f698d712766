"""Login throttling (django-axes, settings in config/settings.py): failed logins are counted per username and client
address and per username from all addresses; past a limit the login is refused for a cool-off. A refused attempt
counts toward nothing (docs/runs.md, "config/login_throttle.py").
"""

import ipaddress

from axes.backends import AxesStandaloneBackend
from axes.exceptions import AxesBackendPermissionDenied
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Sum
from django.shortcuts import render
from django.utils import timezone


class LoginThrottleBackend(AxesStandaloneBackend):
    """Refuses a locked-out username and address before any password is checked.

    Every login over HTTP (the login page, the admin's) authenticates with its request. A call without one comes from
    inside the process (the test client's login, a shell): there is no client address to count, so it is let through
    to the password check instead of raising."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        super().authenticate(request, username=username, password=password, **kwargs)  # this address's lock first
        if username and account_failures(username) >= settings.LOGIN_ACCOUNT_FAILURE_LIMIT:
            request.axes_locked_out = request.login_account_locked = True
            raise AxesBackendPermissionDenied("too many failed logins for this username from all addresses")
        return None


def account_failures(username: str) -> int:
    """Failed logins for this username within the cool-off from every address together, each address counting at most
    its own limit, so that no single address can reach the account's."""
    since = timezone.now() - settings.AXES_COOLOFF_TIME
    per_address = (AccessAttempt.objects.filter(username=username, attempt_time__gte=since)
                   .values("ip_address").annotate(n=Sum("failures_since_start")).values_list("n", flat=True))
    return sum(min(n, settings.AXES_FAILURE_LIMIT) for n in per_address)


def client_address(request) -> str | None:
    """The address failures are counted for: REMOTE_ADDR, or behind a proxy the last entry of the header it sets
    (LOGIN_CLIENT_IP_HEADER), read only when configured since clients can send any header. An IPv6 client counts
    as its /64."""
    meta_key = settings.LOGIN_CLIENT_IP_META_KEY
    if meta_key:
        # The proxy appends the address it saw to whatever list the client sent, so only the last entry is its own.
        entries = [part.strip() for part in request.META.get(meta_key, "").split(",") if part.strip()]
        if entries and (address := counted_address(entries[-1])):
            return address
    return counted_address(request.META.get("REMOTE_ADDR", ""))


def counted_address(text: str) -> str | None:
    """The address as counted: an IPv4 one as it is (mapped into IPv6 or not), an IPv6 one as the first address of its
    /64, since one machine is given a whole /64 and could guess from a new address every time; None if not one."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False).network_address)
    return str(address)


def locked_out(request, response=None, credentials=None):
    """The page a locked-out login gets (429), saying why and for how long."""
    return render(request, "registration/locked_out.html", {
        "username": (credentials or {}).get("username") or request.POST.get("username", ""),
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "account_limit": settings.LOGIN_ACCOUNT_FAILURE_LIMIT,
        "everywhere": getattr(request, "login_account_locked", False),
        "cooloff_minutes": round(settings.AXES_COOLOFF_TIME.total_seconds() / 60),
    }, status=429)
