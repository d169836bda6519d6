"""Bytes per element of each dtype the planner names (the one table; memory/estimate.py
re-exports it)."""

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
