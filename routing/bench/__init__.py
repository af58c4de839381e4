"""Development tools, not runtime code: the benchmarks behind `manage.py bench` and what they
share with the tests (the fake paid providers, the launchers of real server and worker
processes). Nothing outside this package, the bench command and tests/ imports it (an
import-linter contract checks that)."""
