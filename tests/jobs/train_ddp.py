"""The tests' training job is the demo's (one copy, shipped in the package)."""

import runpy
from pathlib import Path

import scout_slurm.lab

runpy.run_path(str(Path(scout_slurm.lab.__file__).parent / "train_demo.py"), run_name="__main__")
