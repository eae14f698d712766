"""The Celery app: its settings are Django's CELERY_* ones (config/settings.py), its tasks each app's tasks.py."""

import os
import warnings

from celery import Celery
from celery.exceptions import SecurityWarning

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# A worker started by root (scripts/start in a container, where root is the only user) is told at length that this
# is "absolutely not recommended". Celery's concern is a message that runs code as root: that is pickle, which it
# refuses outright as root, and the worker accepts JSON only (CELERY_ACCEPT_CONTENT). Only that one notice is
# dropped; the image runs as its own user.
warnings.filterwarnings("ignore", message="You're running the worker with superuser privileges",
                        category=SecurityWarning)

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
