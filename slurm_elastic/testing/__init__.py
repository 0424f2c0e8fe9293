"""Test doubles for code that uses slurm-elastic, and for slurm-elastic's own tests.

The runtime imports nothing here, except `injector` in a worker that a fault plan (SLURM_ELASTIC_FAULTS)
names; importing any of it starts nothing:

- `threadranks`: a job whose ranks are threads of one process (`ThreadJob`), around a real coordinator,
  with process groups that fail a chosen collective (`GroupFault`). Recovery logic is tested in seconds.
- `fakeslurm`: `FakeSlurm`, an in-memory Slurm behind the same `SlurmBackend` interface as the real
  backends, with a clock the test moves (`FakeClock`).
- `slurmcontract`: the behaviour every `SlurmBackend` must show, as reusable checks: run them against a
  double of your own to know it stands in for Slurm.
- `injector`: a fault plan's worker side, attached to the runtime's phase hooks (`worker.phases`).
- `devcluster`: a real local Slurm cluster (one slurmctld, four slurmds) on this machine
  (`python -m slurm_elastic.testing.devcluster up`).

docs/testing.md shows each in use.
"""
