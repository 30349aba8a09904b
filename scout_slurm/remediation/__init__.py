"""Remediation: a plan of frozen actions built from a verdict (pure), then applied through the
one door to Slurm by one executor that records what happened."""
