"""Side effects live here: local (torchrun) and SLURM launches."""
