"""Promote a model's canary version: it becomes the primary and takes all the requests; the
old primary is drained and unloaded by the workers hosting it (no restart)."""

from django.core.management.base import BaseCommand, CommandError

from tenants.errors import ApplicationError
from workers.serving.versions import version_promote


class Command(BaseCommand):
    help = __doc__

    def create_parser(self, prog_name, subcommand, **kwargs):
        # --version is ours (the model's version), replacing Django's.
        return super().create_parser(prog_name, subcommand, conflict_handler="resolve", **kwargs)

    def add_arguments(self, parser):
        parser.add_argument("name", help="the served model")
        parser.add_argument("--version", default="", help="the canary to promote (when several)")

    def handle(self, *args, name, version, **options):
        try:
            promoted = version_promote(name=name, label=version)
        except ApplicationError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"{name} -> {promoted.label} ({promoted.source}), 100%")
