"""The weight quantization report (fp32 vs int8 vs int4) on held-out standard-library text:
relative error per layer, weight bytes, perplexity, greedy top-1 agreement. Default models:
the trained pair in FAIRLANE_MODEL_DIR (`manage.py preset_train`). Options after `--`:
see `python -m workers.engine.quantize --help`."""

from django.conf import settings
from django.core.management.base import BaseCommand

from workers.engine.quantize.__main__ import run


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("options", nargs="*", help="passed to the report; put them after --")

    def run_from_argv(self, argv):
        # Everything after the command's name belongs to the report's own parser.
        self._run(argv[2:])

    def handle(self, *args, options, **kwargs):
        self._run(options)

    def _run(self, argv: list[str]) -> None:
        if "--models-dir" not in argv:
            argv = [*argv, "--models-dir", str(settings.FAIRLANE_MODEL_DIR)]
        run([a for a in argv if a != "--"])
