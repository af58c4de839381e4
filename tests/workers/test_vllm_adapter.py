"""The vLLM runtime's parts without a worker: vLLM's /metrics read for the heartbeat, our
sampling parameters as vLLM's request, vLLM's stream as our engine's outputs (its own usage
counts), the child's command and environment (no secrets), starts that fail with a reason,
and the registry refusing our engine's options on a vLLM model."""

import sys
from pathlib import Path

import pytest

from tenants.errors import InvalidRequest
from workers.engine import SamplingParams
from workers.models import ServedModel
from workers.serving.registration import model_register
from workers.vllm import VllmEngine, VllmStartFailed
from workers.vllm.server import VllmServer, child_environment, metrics_parse
from workers.vllm.wire import Progress, request_body

METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_running{engine="0",model_name="other"} 9.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 120.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 400.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0
"""


def test_vllms_metrics_are_added_up_over_its_engines_for_the_heartbeat():
    figures = metrics_parse(METRICS, model="m")
    assert (figures["num_running"], figures["num_waiting"]) == (5, 1)  # not the other model's
    assert figures["kv_cache_usage"] == 0.75  # the fullest engine
    assert figures["num_generated_tokens"] == 120 and figures["prefix_hit_rate"] == 0.25


def test_sampling_parameters_become_vllms_request_with_the_salt():
    params = SamplingParams(
        max_tokens=7,
        temperature=0.0,
        top_k=5,
        seed=3,
        stop=["\n"],
        logit_bias={5: -100},
        logprobs=2,
        min_tokens=1,
        ignore_eos=True,
    )
    body = request_body("m", [1, 2, 3], params, salt="abc")
    assert body["prompt"] == [1, 2, 3] and body["model"] == "m" and body["cache_salt"] == "abc"
    assert (body["max_tokens"], body["temperature"], body["top_k"], body["seed"]) == (7, 0.0, 5, 3)
    assert body["stop"] == ["\n"] and body["logit_bias"] == {"5": -100}
    assert body["logprobs"] == 2 and body["return_tokens_as_token_ids"] is True
    assert body["min_tokens"] == 1 and body["ignore_eos"] is True
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["return_token_ids"] is True
    plain = request_body("m", [1], SamplingParams(), salt="s")
    assert not {"top_k", "seed", "stop", "logit_bias", "logprobs"} & set(plain)


def test_vllms_stream_becomes_engine_outputs_with_vllms_usage():
    progress = Progress("r:0")
    first = progress.absorb(
        {
            "choices": [
                {
                    "index": 0,
                    "text": "Hi",
                    "token_ids": [7, 8],
                    "finish_reason": None,
                    "logprobs": {
                        "tokens": ["token_id:7", "token_id:8"],
                        "token_logprobs": [-0.5, -0.25],
                        "top_logprobs": [{"token_id:7": -0.5}, {"token_id:9": -0.1}],
                    },
                }
            ],
            "usage": None,
        }
    )
    assert (first.new_token_ids, first.new_text, first.num_output_tokens) == ([7, 8], "Hi", 2)
    assert first.new_logprobs == [-0.5, -0.25] and first.new_top_logprobs == [{7: -0.5}, {9: -0.1}]
    assert (
        progress.absorb(
            {"choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": "length"}]}
        )
        is None
    )
    progress.absorb(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 40,
                "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 32},
            },
        }
    )
    final = progress.final()
    assert final.finished and final.finish_reason == "length"
    assert (final.num_output_tokens, final.num_cached_tokens) == (3, 32)  # vLLM's counts
    cut = Progress("r:1")
    cut.absorb({"choices": [{"index": 0, "text": "a", "token_ids": [4]}]})
    aborted = cut.final(reason="abort")
    assert aborted.finish_reason == "abort" and aborted.num_output_tokens == 1  # what came


def test_the_child_is_started_as_configured_without_the_platforms_secrets(settings, monkeypatch):
    settings.FAIRLANE_VLLM_COMMAND = "/opt/vllm/bin/vllm serve"
    settings.FAIRLANE_VLLM_ARGS = "--gpu-memory-utilization 0.85 --tensor-parallel-size 2"
    server = VllmServer(
        model="llama", path=Path("/models/llama"), max_model_len=4096, max_num_seqs=32
    )
    command = server.command()
    assert command[:3] == ["/opt/vllm/bin/vllm", "serve", "/models/llama"]
    assert command[-4:] == ["--gpu-memory-utilization", "0.85", "--tensor-parallel-size", "2"]
    flags = dict(zip(command[3::2], command[4::2], strict=False))
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == str(server.port)
    assert (flags["--served-model-name"], flags["--max-model-len"]) == ("llama", "4096")
    assert flags["--max-num-seqs"] == "32" and flags["--api-key"] == server.api_key
    assert flags["--load-format"] == "safetensors" and "--trust-remote-code" not in command
    for name in (
        "SECRET_KEY",
        "DATABASE_URL",
        "REDIS_URL",
        "OPENAI_API_KEY",
        "FAIRLANE_CREDENTIALS_KEY",
    ):
        monkeypatch.setenv(name, "secret-value")
    env = child_environment()
    assert "secret-value" not in env.values()
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn" and env["HF_HUB_OFFLINE"] == "1"
    assert env["PATH"] == __import__("os").environ["PATH"]


def test_a_child_that_cannot_start_says_why(settings):
    def start():
        return VllmEngine(
            model="m", path=Path("/models/m"), max_model_len=64, max_num_seqs=2
        ).start()

    settings.FAIRLANE_VLLM_COMMAND = "no-such-vllm serve"
    with pytest.raises(VllmStartFailed, match="requirements-gpu.txt"):
        start()
    settings.FAIRLANE_VLLM_COMMAND = (
        f"{sys.executable} -c \"import sys; print('CUDA out of memory'); sys.exit(3)\""
    )
    with pytest.raises(VllmStartFailed, match="exited with code 3.*CUDA out of memory"):
        start()


@pytest.mark.django_db
def test_a_vllm_model_refuses_our_engines_options():
    with pytest.raises(InvalidRequest) as refused:
        model_register(name="q", source="preset:tiny", runtime="vllm", quantization="int8")
    assert refused.value.param == "runtime" and not ServedModel.objects.exists()
    row = model_register(name="q", source="preset:tiny", runtime="vllm")
    assert row.runtime == ServedModel.Runtime.VLLM
    assert ServedModel.objects.get(name="q").runtime == "vllm"


@pytest.mark.django_db
def test_the_admin_lists_and_filters_models_by_runtime(client, make_user):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    ServedModel.objects.create(name="on-vllm", source="/models/a", runtime="vllm")
    ServedModel.objects.create(name="ours", source="/models/b")
    listing = client.get("/admin/workers/servedmodel/?runtime__exact=vllm").content.decode()
    assert "on-vllm" in listing and "ours" not in listing
    assert "vLLM (a managed `vllm serve` child of the worker)" in listing


@pytest.mark.django_db
def test_the_model_is_verified_before_its_child_is_started(settings, tmp_path):
    """A directory that fails verification never reaches vLLM; a verified one does."""
    import shutil

    from routing.runtimes import runtime_build
    from workers.host import ModelLoadFailed
    from workers.models import ModelVerification
    from workers.serving.catalog import ModelInfo, model_dir

    marker = tmp_path / "started"
    settings.FAIRLANE_VLLM_COMMAND = f"{sys.executable} -c \"open('{marker}', 'w')\""
    settings.FAIRLANE_MODEL_SIGNATURES = "require"
    unsigned = tmp_path / "unsigned"
    shutil.copytree(
        model_dir("preset:tiny"), unsigned, ignore=shutil.ignore_patterns("fairlane-manifest.*")
    )
    ServedModel.objects.create(name="u", source=str(unsigned), runtime="vllm")
    with pytest.raises(ModelLoadFailed) as refused:
        runtime_build("embedded").engine_host.load(
            ModelInfo(name="u", source=str(unsigned), runtime="vllm")
        )
    assert "unsigned" in str(refused.value.cause) and not marker.exists()
    assert ModelVerification.objects.get(model__name="u").status == "refused"
    with pytest.raises(ModelLoadFailed) as exited:  # verified: the command runs (and exits)
        runtime_build("embedded").engine_host.load(
            ModelInfo(name="t", source="preset:tiny", runtime="vllm")
        )
    assert isinstance(exited.value.cause, VllmStartFailed) and marker.exists()
