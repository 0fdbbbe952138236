"""abbench: thermally controlled A/B benchmarking of an MoE expert-streaming engine."""

__version__ = "0.1.0"
