"""What of the GPU check can run without a GPU: the script stops at once and says why, its
streaming check passes against a vLLM-speaking server and fails on a broken one, and its way of
putting the engine's tests on CUDA changes only the default device."""

import json
import os
import subprocess
import sys
from pathlib import Path

from deploy.gpu.stream_check import stream_check
from routing.bench.fake_vllm import FakeVllm

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "gpu-check.sh"


def test_the_script_parses_and_stops_clearly_without_a_gpu(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    bin_dir = tmp_path / "bin"  # an nvidia-smi that finds no GPU, as on a CPU host
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found' >&2\nexit 6\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "GPU_CHECK_OUT": str(tmp_path / "out"),
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
        },
    )
    assert done.returncode == 2 and "no NVIDIA GPU here" in done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["exit"] == 2 and "vllm" not in summary
    assert "install-.venv-vllm.log" not in os.listdir(tmp_path / "out")


def test_the_stream_check_passes_against_a_vllm_server():
    with FakeVllm("fairlane-small", reply_tokens=20) as fake:
        result = stream_check(fake.url + "/v1", "fairlane-small", "none", max_tokens=16)
    assert result["problems"] == [] and result["finish"] == ["length"]
    assert result["usage"]["completion_tokens"] == 16 and result["text"].startswith("t0 t1")


def test_the_stream_check_fails_on_a_server_that_streams_nothing():
    with FakeVllm("fairlane-small", reply_tokens=0) as fake:
        result = stream_check(fake.url + "/v1", "fairlane-small", "none")
    assert "no content streamed" in result["problems"]


def test_engines_default_to_cuda_only_when_asked(tmp_path):
    code = (
        "from deploy.gpu.on_cuda import engines_on_cuda\n"
        "from workers.engine.config import EngineConfig\n"
        "from workers.engine import preset_create\n"
        f"p = str(preset_create('tiny', r'{tmp_path}/m'))\n"
        "assert EngineConfig(model=p).device == 'cpu'\n"
        "engines_on_cuda(); engines_on_cuda()\n"
        "assert EngineConfig(model=p).device == 'cuda'\n"
        "assert EngineConfig(model=p, device='cpu').device == 'cpu'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT}/platform"},
    )
    assert done.returncode == 0, done.stderr
