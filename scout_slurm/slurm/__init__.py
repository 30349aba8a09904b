"""Everything scout says to Slurm: one door (`door.run_slurm`), pure parsers, typed operations."""
