"""The one-line call for custom savers: `scout_slurm.checkpoint.note(path, step=...)` after a
checkpoint is written. Saves through `torch.save(obj, path)` are seen without it. Outside
scout-task it does nothing."""

from __future__ import annotations

import os


def note(path: str | os.PathLike, *, step: int | None = None) -> None:
    from scout_slurm.bootstrap.patches import note_checkpoint

    note_checkpoint(path, step=step)
