"""MetaKernelBench: cross-DSL skill transfer for GPU kernel agents."""

__version__ = "0.1.0"
