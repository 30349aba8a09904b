"""The tests' deepspeed job is the example's (examples/deepspeed/train.py: one copy, tested)."""

import runpy
from pathlib import Path

runpy.run_path(
    str(Path(__file__).resolve().parents[2] / "examples" / "deepspeed" / "train.py"),
    run_name="__main__",
)
