"""Unit constants. Everything inside disaggsim is SI: seconds, bytes, FLOP, bytes/s.

GB = 1e9 bytes (datasheet bandwidths), GiB = 2**30 bytes (memory capacities); names say
which. Human-scale config keys (``_gb_per_s``, ``_tflops``, ``_ms``) are converted once on
load with these constants.
"""

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 2**10
MiB = 2**20
GiB = 2**30
TFLOP = 1e12
MS = 1e-3
US = 1e-6
GBIT = 1e9 / 8  # bytes per gigabit

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
