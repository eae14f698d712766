"""Who may do what on the fleet: one place for the checks that pages, the admin and forms make."""

from django.core.exceptions import PermissionDenied


def can(user, permission: str) -> bool:
    """Side effects (rent, destroy, webhooks, replicas, profiles, launching runs) are for staff who hold the
    permission, named in full: "fleet.rent_instance", "runs.launch_run"."""
    return user.is_staff and user.has_perm(permission)


def require_permission(user, permission: str) -> None:
    """403 for everyone but staff with the permission."""
    if not can(user, permission):
        raise PermissionDenied(f"You need the {permission.partition('.')[2].replace('_', ' ')} permission.")
