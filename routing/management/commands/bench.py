"""`python manage.py bench <name> [options]`: benchmarks that run a baseline and ours in the
same run and print ratios and absolute figures, the last line one JSON object.

  engine   the PyTorch engine against Hugging Face transformers (workers/engine/bench)
  serving  the full HTTP stack against the engine in-process (routing/bench.py)
  fairness the Redis fair queue against FCFS, simulated workers and a real engine
           (workers/fairqueue/bench.py)
  routing  routing decisions per policy with 100 backends, against reading the registry
           from the database each time (routing/bench_routing.py)
"""

from django.core.management.base import BaseCommand, CommandError

BENCHES = {
    "engine": "workers.engine.bench.main",
    "serving": "routing.bench",
    "fairness": "workers.fairqueue.bench",
    "routing": "routing.bench_routing",
}


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("name", choices=sorted(BENCHES))
        parser.add_argument("options", nargs="*",
                            help="passed to the benchmark; put them after --")

    def run_from_argv(self, argv):
        # Everything after the bench's name belongs to the bench's own parser.
        if len(argv) > 2 and argv[2] in BENCHES:
            self._bench(argv[2], argv[3:])
            return
        super().run_from_argv(argv)

    def handle(self, *args, name: str, options: list[str], **kwargs):
        self._bench(name, options)

    def _bench(self, name: str, argv: list[str]) -> None:
        import importlib

        if name not in BENCHES:
            raise CommandError(f"unknown bench {name!r}; choose from {sorted(BENCHES)}")
        importlib.import_module(BENCHES[name]).run(argv)
