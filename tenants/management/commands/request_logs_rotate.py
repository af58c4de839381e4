"""Re-encrypt every stored request log under the first key of FAIRLANE_REQUEST_LOG_KEYS.
Rotation: put the new key first (the old one still listed after it), restart, run this, then
drop the old key (docs/security.md, "Request logs")."""

from django.core.management.base import BaseCommand

from tenants.services.request_logs import request_logs_rotate


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args, **options):
        done = request_logs_rotate()
        self.stdout.write(f"re-encrypted {done} request logs under the first key")
