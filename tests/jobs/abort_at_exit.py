"""The demo job, then one rank aborts at exit (SIGABRT) after it finished training and left the
process group: as when a communicator torn down at interpreter shutdown calls std::terminate."""

import os
import runpy
import sys
from pathlib import Path

import scout_slurm.lab

try:
    runpy.run_path(
        str(Path(scout_slurm.lab.__file__).parent / "train_demo.py"), run_name="__main__"
    )
    code = 0
except SystemExit as exc:
    code = exc.code
if code in (0, None) and os.environ.get("RANK") == os.environ.get("ABORT_AT_EXIT_RANK", "1"):
    sys.stdout.flush()
    os.abort()
sys.exit(code)
