"""Sweeps: the state jobs share (`state`), the Hydra callback that sets it up (`callback`), and how
a job under Slurm stops when Slurm says so (`slurm`)."""
