"""Health checks for the containers: `/healthz` for web, `python -m config.health beat` for beat.

/healthz needs no login and says only whether the database answers; beat's check asks the database when a periodic
task last ran (docs/runs.md, "config/health.py").
"""

import argparse
import os
import sys
from datetime import timedelta

from django.contrib.auth.decorators import login_not_required
from django.db import DatabaseError, connection
from django.http import HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET


@login_not_required
@never_cache
@require_GET
def healthz(request):
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        return HttpResponse(f"database unavailable: {type(exc).__name__}\n", status=503, content_type="text/plain")
    return HttpResponse("ok\n", content_type="text/plain")


def beat_last_sent(max_age: timedelta) -> tuple[bool, str]:
    from django.utils import timezone
    from django_celery_beat.models import PeriodicTask

    newest = (PeriodicTask.objects.filter(enabled=True, interval__isnull=False)
              .order_by("-last_run_at").values_list("last_run_at", flat=True).first())
    if newest is None:
        return False, "beat has not sent any periodic task yet"
    age = timezone.now() - newest
    return age <= max_age, f"beat last sent a periodic task {int(age.total_seconds())} s ago"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m config.health")
    parser.add_argument("what", choices=["beat"])
    # DatabaseScheduler writes last_run_at back every 3 minutes; the fastest entries run every 10-15 s.
    parser.add_argument("--max-age-s", type=int, default=600)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    healthy, line = beat_last_sent(timedelta(seconds=args.max_age_s))
    print(line)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
