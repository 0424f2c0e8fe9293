"""What shows slurm-elastic at work, run by `slurm-elastic demo`, `chaos` and `bench`: the demo and chaos
scenarios, the benchmarks, the workload they train (`workload`) and the measures of a run (`metrics`).
The training runtime never imports this package."""
