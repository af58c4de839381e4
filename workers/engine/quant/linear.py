"""Linear layers with int8 or int4 weights, on PyTorch's kernels where a probe says they work.

The kernels: ``torch._weight_int8pack_mm`` (int8, per-channel scales), and for int4
``torch._weight_int4pack_mm_for_cpu`` on CPU and ``torch._weight_int4pack_mm`` (tinygemm) on
CUDA. They take bf16 activations (PyTorch's vectorised CPU paths and tinygemm are bf16; fp32
activations fall to a scalar loop), so activations are rounded to bf16 on the way in and the
output returned in the model's dtype. Each layer probes its kernel once, on its own shapes,
against the dequantized weights; if the kernel is missing, raises, or disagrees, the layer
dequantizes its weights on every call instead (slower, exact to the dequantized weights).
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.nn import functional as F

from workers.engine.quant.formats import (
    int4_dequantize,
    int4_quantize,
    int8_dequantize,
    int8_quantize,
    nibbles_pack,
    nibbles_unpack,
    padded_columns,
)

logger = logging.getLogger(__name__)
KERNEL_DTYPE = torch.bfloat16
# The probe accepts the kernel when it matches the dequantized weights to bf16 rounding.
PROBE_TOLERANCE = 3e-2
CUDA_INNER_K_TILES = 8


class QuantLinear(nn.Module):
    """``y = x W~^T + b`` where W~ is the dequantized weight. Buffers hold the portable form
    (``qweight``, ``scales``, ``zeros``); ``prepare`` builds the kernel's form."""

    # Buffers (nn.Module types them as Tensor | Module); qweight is dropped once int4's kernel
    # layout holds the codes, and int8 has no zeros.
    qweight: torch.Tensor | None
    scales: torch.Tensor
    zeros: torch.Tensor | None
    bias: nn.Parameter | None

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bits: int,
        group_size: int,
        has_bias: bool = False,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features, self.bits, self.group_size = (
            in_features,
            out_features,
            bits,
            group_size,
        )
        self.padded_in = in_features  # int4: padded to whole groups
        if bits == 8:
            self.register_buffer(
                "qweight", torch.empty(out_features, in_features, dtype=torch.int8, device="meta")
            )
            self.register_buffer("scales", torch.empty(out_features, device="meta"))
            self.zeros = None
        else:
            self.padded_in = padded_columns(in_features, group_size)
            groups = self.padded_in // group_size
            self.register_buffer(
                "qweight",
                torch.empty(out_features, self.padded_in // 2, dtype=torch.uint8, device="meta"),
            )
            self.register_buffer("scales", torch.empty(out_features, groups, device="meta"))
            self.register_buffer("zeros", torch.empty(out_features, groups, device="meta"))
        self.bias = nn.Parameter(torch.empty(out_features, device="meta")) if has_bias else None
        self.kernel = "dequantize"
        self._packed: torch.Tensor | None = None  # the kernel's weight layout
        self._kernel_scales: torch.Tensor | None = None

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, *, bits: int, group_size: int, is_prepared: bool = True
    ) -> QuantLinear:
        weight = linear.weight.detach()
        layer = cls(
            linear.in_features,
            linear.out_features,
            bits=bits,
            group_size=group_size,
            has_bias=linear.bias is not None,
        )
        if bits == 8:
            layer.qweight, layer.scales = int8_quantize(weight)
        else:
            codes, layer.scales, layer.zeros = int4_quantize(weight, group_size)
            layer.qweight = nibbles_pack(codes)
        layer.scales = layer.scales.to(weight.dtype)
        if layer.zeros is not None:
            layer.zeros = layer.zeros.to(weight.dtype)
        if linear.bias is not None:
            layer.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        return layer.prepare() if is_prepared else layer

    def dequantized_weight(self) -> torch.Tensor:
        """W~ in float32 [out, in] (from the portable form, which ``prepare`` keeps for fallbacks
        only)."""
        if self.qweight is None:
            raise RuntimeError("the kernel form replaced the portable weights of this layer")
        if self.bits == 8:
            return int8_dequantize(self.qweight, self.scales)
        assert self.zeros is not None, "int4 layers have zeros"
        return int4_dequantize(
            nibbles_unpack(self.qweight), self.scales, self.zeros, self.group_size
        )[:, : self.in_features]

    def prepare(self) -> QuantLinear:
        """Probe the kernel on this layer's shapes; keep whichever form the forward will use."""
        try:
            self._kernel_build()
            x = torch.randn(4, self.in_features, generator=torch.Generator().manual_seed(0)).to(
                self.scales.device
            )
            got = self._kernel_forward(self._pad(x)).float()
            want = x @ self.dequantized_weight().t()
            is_ok = bool(
                (
                    (got - want).abs().max() <= PROBE_TOLERANCE * want.abs().max().clamp(min=1e-6)
                ).item()
            )
        except (RuntimeError, NotImplementedError, TypeError, AttributeError) as exc:
            logger.debug(
                "quantized kernel unavailable for %dx%d int%d: %s",
                self.out_features,
                self.in_features,
                self.bits,
                exc,
            )
            is_ok = False
        if not is_ok:
            self.kernel, self._packed, self._kernel_scales = "dequantize", None, None
        elif self.bits == 4:
            self.qweight = None  # the kernel layout holds the codes; no second copy
        return self

    def _kernel_build(self) -> None:
        device = self.scales.device
        if self.bits == 8:
            self.kernel, self._packed = "int8pack_mm", self.qweight
            self._kernel_scales = self.scales.to(KERNEL_DTYPE)
            return
        if self.qweight is None or self.zeros is None:
            raise RuntimeError("the kernel form replaced the portable weights of this layer")
        codes = nibbles_unpack(self.qweight)
        # [groups, out, 2]: per group and output channel, (scale, zero)
        self._kernel_scales = (
            torch.stack([self.scales.t(), self.zeros.t()], dim=-1).to(KERNEL_DTYPE).contiguous()
        )
        if device.type == "cpu":
            self.kernel = "int4pack_mm_for_cpu"
            self._packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                codes.to(torch.int32).contiguous(), 1
            )
        else:  # tinygemm wants the even column in the high nibble, and K a multiple of 16 * tiles
            self.kernel = "int4pack_mm"
            high_even = ((codes[:, 0::2] << 4) | codes[:, 1::2]).contiguous()
            tiles = next(t for t in (8, 4, 2, 1) if self.padded_in % (16 * t) == 0)
            self._packed = torch.ops.aten._convert_weight_to_int4pack(high_even, tiles)

    def _pad(self, x2: torch.Tensor) -> torch.Tensor:
        return (
            F.pad(x2, (0, self.padded_in - self.in_features))
            if self.padded_in != self.in_features
            else x2
        )

    def _kernel_forward(self, x2: torch.Tensor) -> torch.Tensor:
        x2 = x2.to(KERNEL_DTYPE).contiguous()
        if self.kernel == "int8pack_mm":
            return torch.ops.aten._weight_int8pack_mm(x2, self._packed, self._kernel_scales)
        if self.kernel == "int4pack_mm_for_cpu":
            return torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2, self._packed, self.group_size, self._kernel_scales
            )
        return torch.ops.aten._weight_int4pack_mm(
            x2, self._packed, self.group_size, self._kernel_scales
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "dequantize":
            return F.linear(x, self.dequantized_weight().to(x.dtype), self.bias)
        y = self._kernel_forward(self._pad(x.reshape(-1, self.in_features))).to(x.dtype)
        y = y.view(*x.shape[:-1], self.out_features)
        return y + self.bias if self.bias is not None else y

    def weight_bytes(self) -> int:
        """Bytes this layer's weights occupy where the forward reads them."""
        tensors = (
            [self._packed, self._kernel_scales]
            if self.kernel != "dequantize"
            else [self.qweight, self.scales, self.zeros]
        )
        if self.kernel == "int8pack_mm":
            tensors.append(self.scales)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)
