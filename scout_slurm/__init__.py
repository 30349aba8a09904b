"""scout-slurm: find the rank that failed first in a synchronous training job on Slurm, keep the
evidence, and act on it (drain, requeue, resume)."""

__version__ = "0.1.0"
