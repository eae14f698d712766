"""Login throttling (django-axes, settings in config/settings.py): failed logins are counted per username and client
address, on the dashboard's login and the admin's alike; past LOGIN_FAILURE_LIMIT that pair is refused, even with the
right password, for LOGIN_COOLOFF_MIN minutes. Staff unlock a pair early by deleting its access attempt in the admin.
"""

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.shortcuts import render


class LoginThrottleBackend(AxesStandaloneBackend):
    """Refuses a locked-out username and address before any password is checked.

    Every login over HTTP (the login page, the admin's) authenticates with its request. A call without one comes from
    inside the process (the test client's login, a shell): there is no client address to count, so it is let through
    to the password check instead of raising."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def client_address(request) -> str | None:
    """The address failures are counted for: REMOTE_ADDR, or behind a proxy the header it sets (LOGIN_CLIENT_IP_HEADER),
    read only when configured, since a client can send any header itself. The proxy appends the address it saw to
    the header's list, so the last entry is the one to trust."""
    meta_key = settings.LOGIN_CLIENT_IP_META_KEY
    if meta_key:
        entries = [part.strip() for part in request.META.get(meta_key, "").split(",") if part.strip()]
        if entries:
            return entries[-1]
    return request.META.get("REMOTE_ADDR")


def locked_out(request, response=None, credentials=None):
    """The page a locked-out login gets (429), saying why and for how long."""
    return render(request, "registration/locked_out.html", {
        "username": (credentials or {}).get("username") or request.POST.get("username", ""),
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "cooloff_minutes": round(settings.AXES_COOLOFF_TIME.total_seconds() / 60),
    }, status=429)
