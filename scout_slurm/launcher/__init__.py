"""`scout-srun`: a drop-in for srun that runs each task under the scout-task shim."""
