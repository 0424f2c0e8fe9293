"""Launchers: the local one (simulated nodes as processes) and the one inside a Slurm allocation."""
