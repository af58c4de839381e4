"""Weight-only int8 / int4 quantization of the decoder's linear layers.

``quantize_model`` swaps q/k/v, o, gate/up and down projections of every layer for
``QuantLinear`` (embeddings, norms and the LM head stay in the model's dtype, as in GPTQ/AWQ
checkpoints). ``workers.engine.quantize`` holds the tools: ``save.quantized_save`` writes a
quantized checkpoint (safetensors) that ``model_load`` reads back, and ``report.quant_report``
measures what quantization costs.
"""

from workers.engine.quant.checkpoint import QUANT_METHOD, quantization_config_read
from workers.engine.quant.linear import QuantLinear
from workers.engine.quant.modules import (
    QUANTIZED_MODULES,
    model_weight_bytes,
    quantize_model,
    quantized_prepare,
    quantized_shells,
)

__all__ = [
    "QUANTIZED_MODULES",
    "QUANT_METHOD",
    "QuantLinear",
    "model_weight_bytes",
    "quantization_config_read",
    "quantize_model",
    "quantized_prepare",
    "quantized_shells",
]
