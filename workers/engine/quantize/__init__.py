"""The quantization tools: ``save`` writes a quantized checkpoint, ``report`` measures what
quantization costs, ``python -m workers.engine.quantize`` runs both. Apart from
``workers.engine.quant`` (the quantized layers), because they load whole models and the
loader itself reads ``quant``."""
