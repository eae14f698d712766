from django.core.management.base import BaseCommand

from fleet import reaping


class Command(BaseCommand):
    help = "Run one reaper pass now and print every decision with its reason."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="report what would be reaped; destroy nothing")

    def handle(self, *args, dry_run: bool, **options):
        report = reaping.reap(dry_run=dry_run)
        for line in report.lines() or ["nothing to reap"]:
            self.stdout.write(("(dry run) " if dry_run else "") + line)
