"""Login throttling (django-axes, settings in config/settings.py): failed logins are counted per username and client
address and per username from all addresses; past a limit the login is refused for a cool-off (docs/runs.md,
"config/login_throttle.py").
"""

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
    """Failed logins for this username within the cool-off, from every address together."""
    since = timezone.now() - settings.AXES_COOLOFF_TIME
    total = AccessAttempt.objects.filter(username=username, attempt_time__gte=since).aggregate(
        n=Sum("failures_since_start"))["n"]
    return total or 0


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
        "account_limit": settings.LOGIN_ACCOUNT_FAILURE_LIMIT,
        "everywhere": getattr(request, "login_account_locked", False),
        "cooloff_minutes": round(settings.AXES_COOLOFF_TIME.total_seconds() / 60),
    }, status=429)
