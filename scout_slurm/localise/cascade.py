"""The localiser's name for the cascade patterns, which live in evidence/cascade.py: the node
digest (evidence/) abridges stderr tails by them and must not import upward into localise/."""

from scout_slurm.evidence.cascade import CASCADE_PATTERNS, mentions_peer_failure

__all__ = ["CASCADE_PATTERNS", "mentions_peer_failure"]
