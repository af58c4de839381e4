#!/usr/bin/env bash
# Make sure the PostgreSQL and Redis named by DATABASE_URL and REDIS_URL answer: start them if
# they are installed locally but stopped, or say clearly what is missing.
set -u
PY=${1:-python3}

db_ok() { "$PY" - <<'PY'
import os, sys
import psycopg
url = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1)
try:
    psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", connect_timeout=3).close()
except Exception as exc:
    print(f"  PostgreSQL: {exc}".strip(), file=sys.stderr)
    sys.exit(1)
PY
}

redis_ok() { "$PY" - <<'PY'
import os, sys
import redis
try:
    redis.Redis.from_url(os.environ["REDIS_URL"], socket_connect_timeout=3).ping()
except Exception as exc:
    print(f"  Redis: {exc}", file=sys.stderr)
    sys.exit(1)
PY
}

missing=()
if ! db_ok 2>/dev/null; then
  if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
    echo "PostgreSQL is not answering; starting the local cluster"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
    for _ in $(seq 1 20); do db_ok 2>/dev/null && break; sleep 0.5; done
  fi
  db_ok || missing+=("PostgreSQL at $DATABASE_URL (install postgresql, or set DATABASE_URL)")
fi
if ! redis_ok 2>/dev/null; then
  if command -v redis-server >/dev/null; then
    echo "Redis is not answering; starting a local redis-server"
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --logfile /tmp/fairlane-redis.log || true
    for _ in $(seq 1 20); do redis_ok 2>/dev/null && break; sleep 0.5; done
  fi
  redis_ok || missing+=("Redis at $REDIS_URL (install redis-server, or set REDIS_URL)")
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "make test needs these services, which are not reachable:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 1
fi
echo "PostgreSQL and Redis are up."
