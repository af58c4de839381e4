"""Development tools, not runtime code: the fair-queue benchmark behind `manage.py bench
fairness`. Runtime code never imports this package (an import-linter contract checks that)."""
