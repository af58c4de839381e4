# The two commands: `make run` (embedded mode, no PostgreSQL or Redis needed) and `make test`
# (the whole suite against local PostgreSQL and Redis). Both set everything up on a fresh clone.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
# platform/ is a source root (settings, urls, asgi, celery_app), not a package.
export PYTHONPATH := $(CURDIR):$(CURDIR)/platform
export DJANGO_SETTINGS_MODULE := settings

# The proxies whose X-Forwarded-For uvicorn believes (comma-separated addresses or networks):
# none unless set, so a client on this host cannot pick the address the sign-in throttle counts.
FORWARDED_ALLOW_IPS ?=

TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/fairlane
TEST_REDIS_URL ?= redis://127.0.0.1:6379/0
# pytest-xdist workers `make test` runs the suite on, a test file each at a time (its module's
# servers start once); each has its own test database and Redis database (tests/xdist_env.py).
# Most of the suite waits on the processes it starts, so 2 workers on 2 cores take about a
# third of one's time. TEST_WORKERS=0: one process, no xdist.
TEST_WORKERS ?= 2

.PHONY: run lint test venv test-venv docs services chromium demo-key manage worker beat bench smoke clean sbom gpu-check

$(VENV)/.installed: requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@touch $@

$(VENV)/.installed-test: requirements-test.txt $(VENV)/.installed
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
	@touch $@

# The docs site's tools only (no runtime requirements): `make docs` works on a fresh clone.
$(VENV)/.installed-docs: requirements-docs.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-docs.txt
	@touch $@

venv: $(VENV)/.installed
test-venv: $(VENV)/.installed-test

# The docs site (docs/, mkdocs.yml) into site/, in strict mode: a broken link or anchor, a page
# left out of the nav or a nav entry without its page fails it. `make test` runs it first.
# NO_MKDOCS_2_WARNING: Material's notice about its own end of life, not about this site.
# No --quiet: it hides the warnings from the count that --strict fails on (mkdocs 1.6.1).
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

run: venv
	$(PY) manage.py migrate --noinput -v0
	$(PY) manage.py collectstatic --noinput -v0
	$(PY) manage.py demo_setup --base-url http://$(HOST):$(PORT)
	FORWARDED_ALLOW_IPS="$(FORWARDED_ALLOW_IPS)" \
		$(PY) -m uvicorn asgi:application --host $(HOST) --port $(PORT) --no-server-header --lifespan off

services:
	@DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
		bash deploy/dev/ensure-services.sh $(PY)

# The portal's browser tests drive Debian's chromium (Playwright's own browser download does
# not work here): installed when missing (CI runs as root; elsewhere through sudo).
chromium:
	@command -v chromium >/dev/null 2>&1 || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "installing Debian's chromium for the browser tests"; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
		chromium >/dev/null; }

# Style and types: ruff's lint and format check, mypy (configuration in pyproject.toml), and
# the one-way import contracts.
lint: test-venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# Lint first: a style or type error fails in seconds, before the suite's minutes.
test: test-venv services chromium docs lint
	$(PY) manage.py collectstatic --noinput -v0
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
		FAIRLANE_DB_POOL_SIZE=0 $(PY) -m pytest -p tests.xdist_env -n $(TEST_WORKERS) --dist loadfile $(ARGS)

demo-key: venv
	$(PY) manage.py demo_setup --new-key --base-url http://$(HOST):$(PORT)

manage: venv
	$(PY) manage.py $(ARGS)

# A GPU worker (and housekeeping): one engine per process, requests share its batches.
worker: venv
	$(PY) -m celery -A celery_app worker -Q gpu,default -P threads -c 4 -l info $(ARGS)

beat: venv
	$(PY) -m celery -A celery_app beat -l info $(ARGS)

# make bench ARGS="engine --quick"  |  make bench ARGS="serving --quick"
bench: test-venv
	$(PY) manage.py migrate --noinput -v0
	$(PY) manage.py bench $(ARGS)

# The first command as a new user meets it: a fresh clone, requirements.txt only, `make run`, a
# streamed chat completion with the printed key (CI runs this before the suite).
smoke:
	bash deploy/dev/smoke-install.sh

# A CycloneDX SBOM of the runtime environment (requirements.txt's closure): make sbom [SBOM=path]
SBOM ?= var/sbom.cdx.json
sbom: test-venv
	$(PY) deploy/sbom.py -o $(SBOM)

# On a CUDA machine only: vLLM, the engine's equivalence tests and bench on the GPU
# (docs/deploying.md)
gpu-check:
	bash deploy/gpu-check.sh

clean:
	rm -rf $(VENV) var staticfiles .pytest_cache site
