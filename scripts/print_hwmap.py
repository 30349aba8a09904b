#!/usr/bin/env python3
"""Print this node's hardware map as JSON, collected by the same code the Prolog runs.

    python scripts/print_hwmap.py [--node NAME] [--sys /sys] [--proc /proc] [--budget 15]

Meant for a machine with an NVIDIA GPU (and an HCA), to see what NVML and sysfs give there. The
exit status is 0 whatever the map says; read `nvml_status` and `problems`.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

from scout_slurm.evidence.store import record_to_obj
from scout_slurm.hwmap.collect import collect_hardware_map


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--node",
        default=socket.gethostname().split(".")[0],
        help="Slurm node name to record (default: the short host name)",
    )
    ap.add_argument(
        "--sys", type=Path, default=Path("/sys"), help="sysfs root (a recorded tree works)"
    )
    ap.add_argument("--proc", type=Path, default=Path("/proc"), help="procfs root")
    ap.add_argument(
        "--budget", type=float, default=15.0, help="seconds before optional parts are skipped"
    )
    args = ap.parse_args(argv)
    hwmap = collect_hardware_map(
        args.node, sysfs_root=args.sys, proc_root=args.proc, deadline_s=args.budget
    )
    json.dump(record_to_obj(hwmap), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
