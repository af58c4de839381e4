"""Weight-only quantization formats, device-independent (what checkpoints store).

int8: symmetric per output channel, ``w ~ q * scale`` with q in [-127, 127].
int4: asymmetric per group of ``group`` input columns, ``w ~ (q - 8) * scale + zero`` with q in
[0, 15] (tinygemm's convention, so the kernels take the scales and zeros as they are);
``zero = min + 8 * scale`` puts q = 0 on the group's minimum. Two codes per byte, the even
column in the low nibble; rows are padded with zero columns to a whole number of groups.
"""

from __future__ import annotations

import torch

INT4_MAX = 15


def int8_quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (codes int8 [N, K], scale float32 [N])."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    codes = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return codes, scale


def int8_dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return codes.float() * scale.float()[:, None]


def padded_columns(cols: int, group: int) -> int:
    """int4 rows are padded with zero columns to a whole number of groups."""
    return -(-cols // group) * group


def int4_quantize(
    weight: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, K] -> (codes uint8 [N, K'] in 0..15, scale float32 [N, K' / group], zero float32 [N, K' /
    group]),
    K' = K padded with zero columns to a multiple of ``group``."""
    rows, cols = weight.shape
    weight = torch.nn.functional.pad(weight.float(), (0, padded_columns(cols, group) - cols))
    cols = weight.shape[1]
    w = weight.view(rows, cols // group, group)
    low, high = w.amin(dim=2), w.amax(dim=2)
    scale = ((high - low) / INT4_MAX).clamp(min=1e-12)
    codes = torch.round((w - low[..., None]) / scale[..., None]).clamp_(0, INT4_MAX).to(torch.uint8)
    return codes.view(rows, cols), scale, low + 8 * scale


def int4_dequantize(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int
) -> torch.Tensor:
    rows, cols = codes.shape
    grouped = codes.view(rows, cols // group, group).float()
    return ((grouped - 8) * scale.float()[..., None] + zero.float()[..., None]).view(rows, cols)


def nibbles_pack(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] (each < 16) -> uint8 [N, K / 2], even column in the low nibble."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


def nibbles_unpack(packed: torch.Tensor) -> torch.Tensor:
    rows, half = packed.shape
    codes = torch.empty(rows, half * 2, dtype=torch.uint8, device=packed.device)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    return codes


def relative_error(weight: torch.Tensor, approx: torch.Tensor) -> float:
    """||W - W~||_F / ||W||_F (a figure: no autograd graph, even for a parameter)."""
    with torch.no_grad():
        w = weight.float()
        return float((w - approx.float()).norm() / w.norm().clamp(min=1e-30))
