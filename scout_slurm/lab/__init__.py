"""The local lab: a real Slurm cluster (slurmctld, several slurmd, private munge) on this machine."""
