"""Delete the stored file bytes that no file row names (left by a process killed between
writing an upload and committing its row), once older than FAIRLANE_FILES_ORPHAN_GRACE_SECONDS
or `--older-than` seconds. The beat runs it daily; the embedded mode's operators run it from
cron."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from routing.batches.files import files_orphans_sweep


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than", type=int, default=None, help="seconds (default: the setting)"
        )

    def handle(self, *args, older_than=None, **options):
        if older_than is not None and older_than < 0:
            raise CommandError("--older-than must be >= 0 seconds")
        grace = None if older_than is None else timedelta(seconds=older_than)
        self.stdout.write(f"deleted {files_orphans_sweep(older_than=grace)} orphaned files")
