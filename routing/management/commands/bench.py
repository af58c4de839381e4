"""`python manage.py bench <name> [options]`: benchmarks that run a baseline and ours in the
same run and print ratios and absolute figures, the last line one JSON object.

  engine   the PyTorch engine against Hugging Face transformers (workers/engine/bench)
  serving  the full HTTP stack against the engine in-process (routing/bench/serving.py)
  fairness the Redis fair queue against FCFS, simulated workers and a real engine
           (workers/bench/fairness.py); with --http, fairness inside the batch over the
           distributed mode's HTTP path (routing/bench/fair_http.py)
  routing  routing decisions per policy with 100 backends, against reading the registry
           from the database each time (routing/bench/decisions.py)
  hops     our functions one chat completion passes through, counted by a profile hook
           (routing/bench/hops.py)
  batches  a 2,000-line batch on the bulk lane beside an interactive streaming client: its
           p95 alone and under the batch, the batch's lines/s (routing/bench/batches.py)
  capacity the capacity planner's predicted p50/p95 TTFT, latency and throughput at 50/80/95 %
           of its predicted capacity against the real HTTP path, distributed mode
           (routing/bench/capacity.py)
  gateway  Fairlane's distributed gateway under 1/16/64 closed-loop clients against the
           upstream alone and LiteLLM's proxy (--litellm VENV) (routing/bench/gateway.py)

Benchmarks are development tools: a bench whose baseline needs a test extra (engine: Hugging
Face transformers) says so in one line in a runtime-only install.
"""

import importlib
import importlib.util
import sys

from django.core.management.base import BaseCommand, CommandError

BENCHES = {
    "engine": "workers.engine.bench.main",
    "serving": "routing.bench.serving",
    "fairness": "workers.bench.fairness",
    "routing": "routing.bench.decisions",
    "gateway": "routing.bench.gateway",
    "hops": "routing.bench.hops",
    "batches": "routing.bench.batches",
    "capacity": "routing.bench.capacity",
}
# Modules a bench needs beyond requirements.txt (its baseline), installed by `make test-venv`.
EXTRAS = {"engine": ("transformers",)}


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("name", choices=sorted(BENCHES))
        parser.add_argument("options", nargs="*", help="passed to the benchmark; put them after --")

    def run_from_argv(self, argv):
        # Everything after the bench's name belongs to the bench's own parser.
        if len(argv) > 2 and argv[2] in BENCHES:
            try:
                self._bench(argv[2], argv[3:])
            except CommandError as exc:  # one line, as Django's own run_from_argv prints it
                self.stderr.write(f"CommandError: {exc}")
                sys.exit(exc.returncode)
            return
        super().run_from_argv(argv)

    def handle(self, *args, name: str, options: list[str], **kwargs):
        self._bench(name, options)

    def _bench(self, name: str, argv: list[str]) -> None:
        if name not in BENCHES:
            raise CommandError(f"unknown bench {name!r}; choose from {sorted(BENCHES)}")
        missing = [m for m in EXTRAS.get(name, ()) if importlib.util.find_spec(m) is None]
        if missing:
            raise CommandError(
                f"bench {name} needs the test extras ({', '.join(missing)}): "
                "run `make test-venv` or `pip install -r requirements-test.txt`"
            )
        module = BENCHES[name]
        if name == "fairness" and "--http" in argv:  # the HTTP scenario needs the platform
            module = "routing.bench.fair_http"
        importlib.import_module(module).run(argv)
