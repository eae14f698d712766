"""Who may do what on the fleet: one place for the checks that pages, the admin and forms make, and for whose work a
user sees (README, "Who sees what")."""

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404

from fleet import hooks
from fleet.models import Alert, Instance

# The one permission that sees and acts on every user's runs, data sets, adapters and inference models (held by staff;
# `manage.py ensure_operator` grants it). Everyone else sees only their own.
OPERATOR = "fleet.operator"


def can(user, permission: str) -> bool:
    """Side effects (rent, destroy, webhooks, replicas, profiles, launching runs) are for staff who hold the
    permission, named in full: "fleet.rent_instance", "runs.launch_run"."""
    return user.is_staff and user.has_perm(permission)


def require_permission(user, permission: str) -> None:
    """403 for everyone but staff with the permission."""
    if not can(user, permission):
        raise PermissionDenied(f"You need the {permission.partition('.')[2].replace('_', ' ')} permission.")


def is_operator(user) -> bool:
    return can(user, OPERATOR)


def owned(queryset: QuerySet, user, owner: str = "created_by") -> QuerySet:
    """The rows of `queryset` that `user` sees: those whose `owner` field is theirs, every row for an operator. A row
    without an owner (made before owners were recorded, or by the product) is an operator's only."""
    return queryset if is_operator(user) else queryset.filter(**{owner: user})


def owned_or_404(queryset: QuerySet, user, pk, owner: str = "created_by"):
    """One row `user` sees; 404 for another user's, the same answer as for none, so its existence is not told."""
    return one_or_404(owned(queryset, user, owner), pk)


def one_or_404(visible: QuerySet, pk):
    found = visible.filter(pk=pk).first()
    if found is None:
        raise Http404("No such page.")
    return found


def boxes_for(user) -> QuerySet:
    """Staff see every box: the fleet's machines and their cost are the account's. Anyone else sees only the boxes
    that did their own work (their runs', their models'), and another's is a 404 as for none."""
    if user.is_staff:
        return Instance.objects.all()
    return Instance.objects.filter(hooks.boxes_of(user)).distinct()


def alerts_for(user) -> QuerySet:
    """Alerts name runs, their reasons and costs: staff see every one, anyone else those of the boxes they see."""
    if user.is_staff:
        return Alert.objects.all()
    return Alert.objects.filter(instance__in=boxes_for(user))
