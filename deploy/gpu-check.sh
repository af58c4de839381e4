#!/usr/bin/env bash
# The GPU check (issue 18), for a machine with an NVIDIA GPU and CUDA; `make gpu-check`.
# Within about 10 minutes it:
#   1. installs two virtualenvs from the pins: .venv-gpu (requirements-test.txt with PyPI's
#      CUDA build of torch==2.13.0, for the engine's tests and bench: transformers 5.24) and
#      .venv-vllm (requirements-gpu.txt: vllm 0.32.0 on the same torch, with the
#      transformers<5.20 that vllm needs). Two venvs, because the two transformers pins conflict;
#   2. runs the engine's equivalence tests with every engine on CUDA (against Hugging Face on
#      the CPU) and `bench engine --quick` with our engine on CUDA;
#   3. makes a model of our own (the `small` preset), signs and verifies it as workers do, serves
#      it with `vllm serve`, streams from it with the official openai client, then streams again
#      through Fairlane (an openai_compatible backend in front of that vLLM server).
# Everything goes to var/gpu-check/ (logs and summary.json). Without a GPU it stops at once.
# Offline: WHEELHOUSE=/path/to/wheels installs from that folder only.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${GPU_CHECK_OUT:-var/gpu-check}
PYTHON=${PYTHON:-python3.11}
VLLM_PORT=${VLLM_PORT:-8811}
API_PORT=${API_PORT:-8812}
mkdir -p "$OUT"
declare -A RESULT
step() { echo; echo "== [$(date +%T), ${SECONDS}s] $*"; }
finish() {
  local status=$?
  [[ -n "${VLLM_PID:-}" ]] && kill "$VLLM_PID" 2>/dev/null || true
  [[ -n "${API_PID:-}" ]] && kill "$API_PID" 2>/dev/null || true
  {
    printf '{"seconds": %d, "exit": %d' "$SECONDS" "$status"
    for key in "${!RESULT[@]}"; do printf ', "%s": %s' "$key" "${RESULT[$key]}"; done
    printf '}\n'
  } > "$OUT/summary.json"
  echo; echo "== summary ($OUT/summary.json)"; cat "$OUT/summary.json"
}
trap finish EXIT

step "0. the GPU"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L; then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi missing or failing); nothing was run." >&2
  exit 2
fi
RESULT[gpu]="\"$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)\""

step "1. virtualenvs (.venv-gpu: tests and bench; .venv-vllm: vllm)"
pip_args=(--quiet --disable-pip-version-check)
[[ -n "${WHEELHOUSE:-}" ]] && pip_args+=(--no-index --find-links "$WHEELHOUSE")
make_venv() {  # name requirements
  [[ -x "$1/bin/python" ]] || "$PYTHON" -m venv "$1"
  "$1/bin/python" -m pip install "${pip_args[@]}" -r "$2" > "$OUT/install-$1.log" 2>&1
}
make_venv .venv-gpu requirements-test.txt & gpu_pid=$!
make_venv .venv-vllm requirements-gpu.txt & vllm_pid=$!
wait "$gpu_pid" || { tail -20 "$OUT/install-.venv-gpu.log"; exit 1; }
wait "$vllm_pid" || { tail -20 "$OUT/install-.venv-vllm.log"; exit 1; }
for venv in .venv-gpu .venv-vllm; do
  "$venv/bin/python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA in torch';
print('$venv: torch', torch.__version__, 'CUDA', torch.version.cuda)"
done
.venv-vllm/bin/python -c "import vllm, transformers; print('vllm', vllm.__version__,
'transformers', transformers.__version__)"
export PYTHONPATH="$PWD:$PWD/platform" DJANGO_SETTINGS_MODULE=settings

step "2a. the engine's equivalence tests, engines on CUDA"
timeout 240 .venv-gpu/bin/python -m pytest tests/engine/test_equivalence.py -q -p no:django \
  --confcutdir=tests/engine -p deploy.gpu.cuda_plugin 2>&1 | tee "$OUT/equivalence.log"
RESULT[equivalence]="\"$(tail -1 "$OUT/equivalence.log" | tr -d '"=')\""

step "2b. bench engine --quick, our engine on CUDA"
bench=(-m deploy.gpu.on_cuda workers.engine.bench --quick --json-out "$OUT/bench-engine.json")
if .venv-gpu/bin/python -m workers.engine.bench --help | grep -q -- --device; then
  bench=(-m workers.engine.bench --quick --device cuda --json-out "$OUT/bench-engine.json")
else
  echo "note: the bench has no --device; ours runs on CUDA, its Hugging Face baselines on CPU"
fi
timeout 240 .venv-gpu/bin/python "${bench[@]}" 2>&1 | tee "$OUT/bench-engine.log"
RESULT[bench]="\"$OUT/bench-engine.json\""

step "3a. a model of our own, signed and verified as a worker would"
export FAIRLANE_DATA_DIR="$PWD/$OUT/data" FAIRLANE_MODEL_SIGNATURES=require
unset DATABASE_URL REDIS_URL
MODEL="$PWD/$OUT/models/small"
.venv-gpu/bin/python manage.py migrate -v0
.venv-gpu/bin/python -c "from workers.engine import preset_create; preset_create('small', '$MODEL')"
.venv-gpu/bin/python manage.py model_sign "$MODEL" --dev-key --name fairlane-small \
  --source preset:small@0
.venv-gpu/bin/python manage.py model_verify "$MODEL"

step "3b. vllm serve, and the official client streaming from it"
VLLM_WORKER_MULTIPROC_METHOD=spawn .venv-vllm/bin/vllm serve "$MODEL" \
  --served-model-name fairlane-small --host 127.0.0.1 --port "$VLLM_PORT" --dtype bfloat16 \
  --max-model-len 2048 --gpu-memory-utilization 0.3 --enforce-eager \
  > "$OUT/vllm.log" 2>&1 & VLLM_PID=$!
for _ in $(seq 240); do
  curl -sf "http://127.0.0.1:$VLLM_PORT/health" >/dev/null && break
  kill -0 "$VLLM_PID" 2>/dev/null || { tail -40 "$OUT/vllm.log"; exit 1; }
  sleep 1
done
curl -sf "http://127.0.0.1:$VLLM_PORT/health" >/dev/null || { tail -40 "$OUT/vllm.log"; exit 1; }
RESULT[vllm]=$(.venv-vllm/bin/python deploy/gpu/stream_check.py \
  --base-url "http://127.0.0.1:$VLLM_PORT/v1" --model fairlane-small)
echo "${RESULT[vllm]}"
curl -s "http://127.0.0.1:$VLLM_PORT/metrics" | grep -E \
  '^vllm:(num_requests_running|num_requests_waiting|kv_cache_usage_perc)' | tee "$OUT/vllm-metrics.txt"

step "3c. the same model through Fairlane (openai_compatible backend in front of vLLM)"
.venv-gpu/bin/python manage.py demo_setup --new-key --base-url "http://127.0.0.1:$API_PORT" \
  > "$OUT/demo.txt"
KEY=$(grep -o 'fl-[A-Za-z0-9_-]*-[A-Za-z0-9_-]*' "$OUT/demo.txt" | head -1)
.venv-gpu/bin/python manage.py backend_add vllm-gpu --kind openai_compatible \
  --base-url "http://127.0.0.1:$VLLM_PORT" --model fairlane-small=fairlane-small
.venv-gpu/bin/python -m uvicorn asgi:application --host 127.0.0.1 --port "$API_PORT" \
  --lifespan off > "$OUT/api.log" 2>&1 & API_PID=$!
for _ in $(seq 60); do curl -sf "http://127.0.0.1:$API_PORT/healthz" >/dev/null && break; sleep 1; done
RESULT[fairlane]=$(.venv-gpu/bin/python deploy/gpu/stream_check.py \
  --base-url "http://127.0.0.1:$API_PORT/v1" --model fairlane-small --api-key "$KEY")
echo "${RESULT[fairlane]}"
step "done in ${SECONDS}s"
