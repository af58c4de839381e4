"""``python -m workers.engine.bench``: our engine against Hugging Face transformers, same run.

``run(argv)`` is the entry point the Django command ``manage.py bench engine`` wraps.
"""

from workers.engine.bench.main import run

__all__ = ["run"]
