"""Speculative decoding: proposers (n-gram prompt lookup, a draft model), verification of k + 1
positions in one target pass, the exact acceptance rule, and the adaptive controller.

The configuration, ``SpeculativeConfig``, lives with the engine's in ``workers.engine.config``.
"""
