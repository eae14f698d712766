import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = ("Makes sure an operator (a superuser) exists: OPERATOR_USERNAME and OPERATOR_PASSWORD from the "
            "environment, or a generated password printed once.")

    def handle(self, *args, **options):
        User = get_user_model()
        username = os.environ.get("OPERATOR_USERNAME", "").strip() or "operator"
        password = os.environ.get("OPERATOR_PASSWORD", "")
        user = User.objects.filter(username=username).first()
        if user is not None:
            if password and not user.check_password(password):
                user.set_password(password)
                user.save(update_fields=["password"])
                self.stdout.write(f"Operator {username!r}: password set from OPERATOR_PASSWORD.")
            else:
                self.stdout.write(f"Operator {username!r} exists; its password is unchanged.")
            return
        generated = not password
        password = password or secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        if generated:
            # Printed once, here; only its hash is stored.
            self.stdout.write(self.style.SUCCESS(
                f"Created operator login: username {username!r}, password {password!r} (shown only now)."))
        else:
            self.stdout.write(self.style.SUCCESS(f"Created operator {username!r} with OPERATOR_PASSWORD."))
