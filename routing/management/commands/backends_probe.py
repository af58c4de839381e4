"""Probe every backend's health once (what the beat task does every
FAIRLANE_HEALTH_INTERVAL_SECONDS), e.g. from cron in the embedded mode, which runs no beat."""

from routing.health import backends_probe
from routing.runtimes import RuntimeCommand


class Command(RuntimeCommand):
    help = __doc__

    def handle(self, *args, **options):
        for name, health in sorted(backends_probe(pool=self.runtime.pool).items()):
            self.stdout.write(f"{name}: {health}")
