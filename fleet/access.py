"""Who may do what on the fleet: one place for the checks that pages, the admin and forms make."""

from django.core.exceptions import PermissionDenied


def can(user, codename: str) -> bool:
    """Side effects on the fleet (rent, destroy, webhooks, replicas) are for staff who hold the permission."""
    return user.is_staff and user.has_perm(f"fleet.{codename}")


def require_permission(user, codename: str) -> None:
    """403 for everyone but staff with the permission."""
    if not can(user, codename):
        raise PermissionDenied(f"You need the {codename.replace('_', ' ')} permission.")
