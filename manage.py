#!/usr/bin/env python
"""Django's command-line utility for Fairlane."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# platform/ is a source root (settings, urls, asgi, the Celery app), deliberately not a
# package: a package named `platform` would shadow the standard library's module.
sys.path.insert(0, str(ROOT / "platform"))
sys.path.insert(0, str(ROOT))


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
    from django.core.management import execute_from_command_line

    import celery_app  # noqa: F401  (the current app for tasks sent from commands)

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
