import os
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management.base import BaseCommand

from fleet.access import OPERATOR


class Command(BaseCommand):
    help = ("Makes sure an operator (a superuser holding the operator permission, which sees every user's work) "
            "exists: OPERATOR_USERNAME and OPERATOR_PASSWORD from the environment, or a generated password printed "
            "once.")

    def handle(self, *args, **options):
        User = get_user_model()
        username = os.environ.get("OPERATOR_USERNAME", "").strip() or "operator"
        password = os.environ.get("OPERATOR_PASSWORD", "")
        user = User.objects.filter(username=username).first()
        if user is not None:
            self._grant_operator(user)
            if password and not user.check_password(password):
                user.set_password(password)
                user.save(update_fields=["password"])
                self.stdout.write(f"Operator {username!r}: password set from OPERATOR_PASSWORD.")
            else:
                self.stdout.write(f"Operator {username!r} exists; its password is unchanged.")
            return
        generated = not password
        password = password or secrets.token_urlsafe(12)
        self._grant_operator(User.objects.create_superuser(username=username, email="", password=password))
        if generated:
            # Printed once, here; only its hash is stored.
            self.stdout.write(self.style.SUCCESS(
                f"Created operator login: username {username!r}, password {password!r} (shown only now)."))
        else:
            self.stdout.write(self.style.SUCCESS(f"Created operator {username!r} with OPERATOR_PASSWORD."))

    def _grant_operator(self, user) -> None:
        """Held explicitly, not only through superuser status: it stays if that is taken away."""
        app_label, codename = OPERATOR.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
