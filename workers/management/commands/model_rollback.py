"""Roll a model back: retire its canaries (the primary takes all the requests again), or, with
no canary, return from the primary to the version that was primary before it. The workers
drain and unload what is retired (no restart)."""

from django.core.management.base import BaseCommand, CommandError

from tenants.errors import ApplicationError
from workers.serving.versions import version_rollback


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("name", help="the served model")

    def handle(self, *args, name, **options):
        try:
            serving = version_rollback(name=name)
        except ApplicationError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"{name} -> {serving.label} ({serving.source}), 100%")
