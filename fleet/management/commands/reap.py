"""`manage.py reap`: one reaper pass now, each live box printed with its decision and the reason."""

from django.core.management.base import BaseCommand

from fleet.reaper import sweep


class Command(BaseCommand):
    help = "Run one reaper pass now and print every decision with its reason."

    def add_arguments(self, parser):
        # No flag: REAPER_DRY_RUN decides, as for beat's passes; a flag only ever makes the pass safer.
        parser.add_argument("--dry-run", action="store_true", default=None,
                            help="report what would be reaped; destroy nothing (the default when REAPER_DRY_RUN is on)")

    def handle(self, *args, dry_run: bool | None, **options):
        report = sweep.reap(dry_run=dry_run)
        for line in report.every_line():
            self.stdout.write(("(dry run) " if report.dry_run else "") + line)
