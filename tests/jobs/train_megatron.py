"""The tests' megatron job is the example's (examples/megatron/train.py: one copy, tested)."""

import runpy
from pathlib import Path

runpy.run_path(
    str(Path(__file__).resolve().parents[2] / "examples" / "megatron" / "train.py"),
    run_name="__main__",
)
