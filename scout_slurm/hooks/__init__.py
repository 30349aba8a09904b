"""What slurm.conf points at: Prolog, node Epilog, controller Epilog."""
