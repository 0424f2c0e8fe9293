"""The handlers behind `slurm-elastic <command>`; each module adds its parser and runs its command."""
