#!/usr/bin/env bash
# The first command as a new user meets it (run by CI before the suite, and by `make smoke`):
# a fresh clone of this checkout's HEAD into a temporary directory, a venv with requirements.txt
# only (no test extras), `make run` on a free port, the key it prints, `GET /v1/models`, one
# streamed chat completion read to `data: [DONE]`, then the server is stopped.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
SERVER=""
cleanup() {
  if [ -n "$SERVER" ]; then kill -TERM -- "-$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "smoke: FAILED: $*" >&2; echo "--- make run's output ---" >&2; tail -n 60 "$WORK/run.log" >&2 || true; exit 1; }

started=$(date +%s)
git clone -q "$SRC" "$WORK/fairlane"
cd "$WORK/fairlane"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# A new user's shell: none of the test run's settings leak in.
setsid env -u DATABASE_URL -u REDIS_URL -u PYTHONPATH -u DJANGO_SETTINGS_MODULE -u VIRTUAL_ENV \
  -u SECRET_KEY -u MAKEFLAGS -u MAKELEVEL -u CELERY_BROKER_URL \
  make --no-print-directory run PORT="$PORT" > "$WORK/run.log" 2>&1 &
SERVER=$!

for _ in $(seq 1 900); do
  grep -q "Uvicorn running" "$WORK/run.log" 2>/dev/null && break
  kill -0 "$SERVER" 2>/dev/null || fail "make run exited"
  sleep 1
done
grep -q "Uvicorn running" "$WORK/run.log" || fail "make run did not serve within 15 minutes"
KEY=$(grep -oE 'fl-[a-z0-9]{12}-[A-Za-z0-9]{43}' "$WORK/run.log" | head -n 1)
[ -n "$KEY" ] || fail "make run printed no API key"
# The venv holds the runtime requirements only.
if .venv/bin/python -c "import pytest" 2>/dev/null; then fail "the runtime venv has pytest: test extras leaked in"; fi

BASE="http://127.0.0.1:$PORT"
curl -fsS "$BASE/v1/models" -H "Authorization: Bearer $KEY" > "$WORK/models.json" \
  || fail "GET /v1/models"
grep -q '"id": *"tiny"' "$WORK/models.json" || fail "GET /v1/models does not list tiny: $(cat "$WORK/models.json")"
curl -fsSN --max-time 120 "$BASE/v1/chat/completions" -H "Authorization: Bearer $KEY" \
  -H "Content-Type: application/json" \
  -d '{"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16, "stream": true}' \
  > "$WORK/stream.txt" || fail "POST /v1/chat/completions"
grep -q '"content"' "$WORK/stream.txt" || fail "the stream carried no content: $(head -c 2000 "$WORK/stream.txt")"
[ "$(grep -v '^$' "$WORK/stream.txt" | tail -n 1)" = "data: [DONE]" ] \
  || fail "the stream did not end with data: [DONE]: $(tail -c 2000 "$WORK/stream.txt")"

# A benchmark whose baseline needs the test extras says so in one line, never a traceback.
if .venv/bin/python manage.py bench engine > "$WORK/bench.txt" 2>&1; then fail "bench engine ran without transformers"; fi
grep -q "needs the test extras" "$WORK/bench.txt" && ! grep -q Traceback "$WORK/bench.txt" \
  || fail "bench engine in a runtime-only venv: $(cat "$WORK/bench.txt")"

echo "smoke: a fresh clone's make run served /v1/models and a streamed chat completion" \
     "($(grep -c '^data: {' "$WORK/stream.txt") chunks, then [DONE]) in $(( $(date +%s) - started )) s"
