"""Weight-only int8/int4: formats, PyTorch's kernels behind a probe (and the fallback), quantized
checkpoints, and the report's figures against a dense model holding the dequantized weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from workers.engine import EngineConfig, LLMEngine, SamplingParams, UnsupportedModel
from workers.engine.loader import model_load
from workers.engine.quant import QuantLinear, quantize_model
from workers.engine.quant.formats import (
    int4_dequantize,
    int4_quantize,
    int8_dequantize,
    int8_quantize,
    nibbles_pack,
    nibbles_unpack,
    relative_error,
)
from workers.engine.quant.modules import model_weight_bytes
from workers.engine.quantize.report import layer_errors, model_logits, quant_report, score
from workers.engine.quantize.save import quantized_save

CASES = [("int8", 128), ("int4", 32), ("int4", 64), ("int4", 128)]
CPU_KERNELS = {"int8": "int8pack_mm", "int4": "int4pack_mm_for_cpu"}


def _weight(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) / cols**0.5


def test_formats_round_trip_within_their_precision():
    w = _weight(96, 256)
    assert relative_error(w, int8_dequantize(*int8_quantize(w))) < 0.01
    for group, bound in ((32, 0.09), (128, 0.11)):
        codes, scale, zero = int4_quantize(w, group)
        assert codes.max() <= 15 and scale.shape == (96, 256 // group)
        assert relative_error(w, int4_dequantize(codes, scale, zero, group)) < bound
    codes = torch.randint(0, 16, (7, 12), dtype=torch.uint8)
    assert torch.equal(nibbles_unpack(nibbles_pack(codes)), codes)
    # 176 columns are padded to whole groups of 32 (the layer pads its input with zeros too)
    w = _weight(8, 176)
    codes, scale, zero = int4_quantize(w, 32)
    assert codes.shape == (8, 192)
    assert relative_error(w, int4_dequantize(codes, scale, zero, 32)[:, :176]) < 0.09


@pytest.mark.parametrize(("method", "group"), CASES)
def test_quantized_linear_runs_pytorchs_kernel_and_matches_the_dequantized_weights(method, group):
    linear = nn.Linear(176, 96, bias=False)
    linear.weight.data = _weight(96, 176, seed=1)
    layer = QuantLinear.from_linear(linear, bits={"int8": 8, "int4": 4}[method], group_size=group)
    assert layer.kernel == CPU_KERNELS[method]  # torch 2.13's CPU kernels pass the probe here
    dense = _dequantized(linear.weight.detach(), method, group)
    x = torch.randn(5, 3, 176, generator=torch.Generator().manual_seed(2))
    want = x @ dense.t()
    torch.testing.assert_close(layer(x), want, atol=2e-2 * float(want.abs().max()), rtol=0)


def _dequantized(weight: torch.Tensor, method: str, group: int) -> torch.Tensor:
    if method == "int8":
        return int8_dequantize(*int8_quantize(weight))
    codes, scale, zero = int4_quantize(weight, group)
    return int4_dequantize(codes, scale, zero, group)[:, : weight.shape[1]]


@pytest.mark.parametrize(("method", "group"), [("int8", 128), ("int4", 64)])
def test_without_a_kernel_the_layer_dequantizes_exactly(monkeypatch, method, group):
    def missing(*args, **kwargs):
        raise NotImplementedError("no kernel on this build")

    for name in ("_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu", "_weight_int4pack_mm"):
        monkeypatch.setattr(torch.ops.aten, name, missing)
    linear = nn.Linear(128, 64, bias=True)
    layer = QuantLinear.from_linear(linear, bits={"int8": 8, "int4": 4}[method], group_size=group)
    assert layer.kernel == "dequantize"
    x = torch.randn(4, 128)
    want = x @ _dequantized(linear.weight.detach(), method, group).t() + linear.bias.detach()
    torch.testing.assert_close(layer(x), want, atol=1e-5, rtol=1e-5)


def _dense_reference(model_dir: Path, method: str, group: int) -> nn.Module:
    """The model with every quantized layer replaced by a plain Linear holding its dequantized
    weights."""
    model = model_load(
        model_dir, device=torch.device("cpu"), dtype=torch.float32, max_positions=1024
    )
    quantize_model(model, method, group_size=group, is_prepared=False)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, QuantLinear):
                dense = nn.Linear(
                    child.in_features, child.out_features, bias=child.bias is not None
                )
                dense.weight.data = child.dequantized_weight()
                setattr(module, name, dense)
    return model


@pytest.fixture(scope="module")
def windows() -> list[list[int]]:
    g = torch.Generator().manual_seed(4)
    return [torch.randint(5, 261, (96,), generator=g).tolist() for _ in range(6)]


@pytest.mark.parametrize(("method", "group"), [("int8", 128), ("int4", 32)])
def test_report_figures_match_a_dense_dequantized_reference(tiny_dir, windows, method, group):
    report = quant_report(tiny_dir, windows, methods=(method,), group_size=group)
    row, fp32 = report["methods"][method], report["methods"]["fp32"]
    dense = _dense_reference(tiny_dir, method, group)
    unquantized = model_load(
        tiny_dir, device=torch.device("cpu"), dtype=torch.float32, max_positions=1024
    )
    base = score(unquantized, windows)
    reference = score(dense, windows, base["argmax"])
    assert row["perplexity"] == pytest.approx(reference["perplexity"], rel=5e-3)
    assert row["top1_agreement"] == pytest.approx(reference["top1_agreement"], abs=0.03)
    assert fp32["perplexity"] == pytest.approx(base["perplexity"], rel=1e-6)
    assert row["relative_error"] == layer_errors(unquantized, method, group_size=group)
    for name, error in row["relative_error"].items():
        i, path = name.split(".", 2)[1], name.split(".", 2)[2]
        parent, child = path.split(".")
        original = getattr(getattr(unquantized.layers[int(i)], parent), child).weight
        approx = getattr(getattr(dense.layers[int(i)], parent), child).weight
        assert error == pytest.approx(relative_error(original, approx), rel=1e-4)
    assert row["kernels"] == [CPU_KERNELS[method]]
    assert row["bytes_ratio"] <= (0.3 if method == "int8" else 0.25)
    logits = model_logits(dense, windows[0])
    torch.testing.assert_close(
        model_logits(_quantized(tiny_dir, method, group), windows[0]),
        logits,
        atol=0.05 * float(logits.abs().max()),
        rtol=0,
    )


def _quantized(model_dir: Path, method: str, group: int) -> nn.Module:
    model = model_load(
        model_dir, device=torch.device("cpu"), dtype=torch.float32, max_positions=1024
    )
    quantize_model(model, method, group_size=group)
    return model


def test_quantized_checkpoint_saves_as_safetensors_and_loads_quantized(tiny_dir, tmp_path, prompts):
    saved = quantized_save(tiny_dir, tmp_path / "tiny-int4", "int4", group_size=32)
    config = json.loads((saved / "config.json").read_text())
    assert (
        config["quantization_config"]["method"] == "int4"
        and config["quantization_config"]["group_size"] == 32
    )
    with safe_open(str(saved / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("layers.0.mlp.down_proj.qweight").dtype == torch.uint8
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    loaded = LLMEngine(EngineConfig(model=str(saved), num_kv_blocks=256))
    at_load = LLMEngine(
        EngineConfig(
            model=str(tiny_dir), num_kv_blocks=256, quantization="int4", quantization_group_size=32
        )
    )
    assert loaded.stats()["quantization"] == "int4"
    assert [o.token_ids for o in loaded.generate(prompts[:6], params)] == [
        o.token_ids for o in at_load.generate(prompts[:6], params)
    ]
    assert (
        model_weight_bytes(loaded.runner.model)["linear_bytes"]
        < 0.2
        * model_weight_bytes(
            LLMEngine(EngineConfig(model=str(tiny_dir), num_kv_blocks=64)).runner.model
        )["linear_bytes"]
    )
    with pytest.raises(UnsupportedModel):
        LLMEngine(EngineConfig(model=str(saved), num_kv_blocks=64, quantization="int8"))


def test_quantized_engine_with_speculation_serves_and_frees_everything(tiny_dir, prompts):
    from tests.engine.conftest import assert_no_leaks
    from tests.engine.spec_helpers import always

    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_dir),
            num_kv_blocks=128,
            quantization="int8",
            speculative=always("ngram", 3, prompt_lookup_min=1),
        )
    )
    outs = engine.generate(
        prompts, SamplingParams(max_tokens=16, temperature=0.7, seed=3, ignore_eos=True)
    )
    assert all(len(o.token_ids) == 16 for o in outs)
    assert_no_leaks(engine)


@pytest.mark.gpu
@pytest.mark.parametrize(("method", "group"), CASES)
def test_cuda_quantized_linear_matches_the_dequantized_weights(method, group):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (none on this machine)")
    linear = nn.Linear(512, 256, bias=False).cuda()
    layer = QuantLinear.from_linear(linear, bits={"int8": 8, "int4": 4}[method], group_size=group)
    x = torch.randn(8, 512, device="cuda")
    want = x @ _dequantized(linear.weight.detach(), method, group).t()
    torch.testing.assert_close(layer(x), want, atol=2e-2 * float(want.abs().max()), rtol=0)
    print(f"cuda {method} g{group}: {layer.kernel}")
