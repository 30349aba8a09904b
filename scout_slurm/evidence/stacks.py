"""The ranks' dumped stacks, as the watchdog left them in `run-N/stacks/` (the job's files:
read bounded and without following a link): `main_thread` is a pure parser of faulthandler's
dump, `load_stacks` reads the suspects' (the incident's cause of a hang, `scout show`, the page)."""

from __future__ import annotations

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.safeio import safe_read_bytes

STACK_FRAMES = 25  # of the suspect's main thread, innermost first as faulthandler prints it


def main_thread(dump: str) -> list[str]:
    """The thread faulthandler marked current (the one the signal interrupted: the training's
    main thread) from the last dump in `dump`, innermost frame first as faulthandler prints it;
    [] when the text holds none."""
    blocks: list[list[str]] = []
    for line in dump.splitlines():
        if line.startswith(("Current thread ", "Thread ")):
            blocks.append([line])
        elif blocks and line.startswith("  File "):
            blocks[-1].append(line)
    current = [b for b in blocks if b[0].startswith("Current thread ")]
    if not current:
        return []
    block = current[-1]
    return [block[0], *block[1 : 1 + STACK_FRAMES]] + (
        [f"  ... {len(block) - 1 - STACK_FRAMES} more frames"]
        if len(block) - 1 > STACK_FRAMES
        else []
    )


def load_stacks(folder: JobFolder, run: int, ranks: list[int]) -> list[tuple[int, tuple[str, ...]]]:
    """The suspects' dumped stacks (at most 4 ranks): the current thread's frames, or the dump's
    last lines when no Python dump is in it (a stopped process: the watchdog's /proc view)."""
    out = []
    for rank in ranks[:4]:
        try:
            text = safe_read_bytes(
                folder.stacks_path(run, rank), max_bytes=4 << 20, root=folder.root
            ).decode("utf-8", "replace")
        except EvidenceError:
            continue
        lines = main_thread(text) or [ln for ln in text.splitlines() if ln.strip()][-20:]
        if not lines:  # an empty file: the rank had ended before anything was dumped
            continue
        out.append((rank, tuple(line[:300] for line in lines)))
    return out
