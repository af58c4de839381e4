"""Delete the request logs past their tenant's retention now (the beat and the embedded
server run this every FAIRLANE_REQUEST_LOG_SWEEP_SECONDS)."""

from django.core.management.base import BaseCommand

from tenants.services.request_logs import request_logs_expire


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args, **options):
        self.stdout.write(f"deleted {request_logs_expire()} request logs past their retention")
