"""How a quantized checkpoint says so: ``quantization_config`` in its config.json (written by
``workers.engine.quantize.save``)."""

from __future__ import annotations

from typing import Any

from workers.engine.errors import UnsupportedModel

QUANT_METHOD = "fairlane-weight-only"


def quantization_config_read(raw_config: dict[str, Any]) -> tuple[str, int] | None:
    """(method, group size) of a quantized checkpoint's config.json, else None."""
    qc = raw_config.get("quantization_config")
    if not qc:
        return None
    if qc.get("quant_method") != QUANT_METHOD:
        raise UnsupportedModel(
            f"quantization {qc.get('quant_method')!r} is not supported (only {QUANT_METHOD!r})"
        )
    return qc["method"], int(qc.get("group_size", 128))
