"""Faults act through the runtime's phase hooks: a job no fault plan names loads no fault code and puts no
hook in the user's model or optimizer; a plan that names the worker attaches only the phases it uses."""

from __future__ import annotations

import json
import subprocess
import sys

from slurm_elastic.worker.phases import PhaseHooks


def test_hooks_fire_in_order_at_their_phase_only() -> None:
    phases, seen = PhaseHooks(), []
    phases.on("commit", lambda step: seen.append(("a", step)))
    phases.on("commit", lambda step: seen.append(("b", step)))
    phases.on("forward", lambda step: seen.append(("f", step)))
    phases.fire("commit", 3)
    phases.fire("recovery", 4)  # nothing attached there
    assert seen == [("a", 3), ("b", 3)]
    assert phases.attached("forward") and not phases.attached("recovery")


def test_nothing_is_called_on_a_send_unless_a_hook_is_attached() -> None:
    phases = PhaseHooks()
    assert phases.sending() is None
    sent: list[tuple[int, list[int]]] = []
    phases.on_send(lambda dst, payload: sent.append((dst, payload)))
    send = phases.sending()
    assert send is not None
    send(2, [1])
    assert sent == [(2, [1])]


PROBE = """
import json, os, sys, torch
from slurm_elastic import ElasticJob
from slurm_elastic.worker.env import worker_env
from slurm_elastic.worker.ports import Ports
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.zeros(2), torch.zeros(1))] * 8
env = worker_env({**os.environ, "SLURM_ELASTIC_NODE": "n1"})
job = ElasticJob(model, opt, dataset=data, global_batch=4, micro_batch=2, env=env, ports=Ports(process_hooks=False))
print(json.dumps({
    "injector_loaded": "slurm_elastic.testing.injector" in sys.modules,
    "model_hooks": len(model._forward_pre_hooks),
    "optimizer_hooks": len(opt._optimizer_step_pre_hooks),
    "phases": sorted(job._phases._at),
}))
"""


def probe(faults: str | None) -> dict[str, object]:
    env = {"PATH": "/usr/bin:/bin", **({"SLURM_ELASTIC_FAULTS": faults} if faults else {})}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_an_unarmed_job_loads_no_fault_code_and_hooks_nothing() -> None:
    assert probe(None) == {"injector_loaded": False, "model_hooks": 0, "optimizer_hooks": 0, "phases": []}


def test_a_plan_for_another_node_arms_nothing_here() -> None:
    other = json.dumps([{"node": "n2", "step": 2, "phase": "forward", "action": "kill"}])
    assert probe(other)["injector_loaded"] is False


def test_a_plan_naming_this_worker_attaches_the_phases_it_uses_and_no_other() -> None:
    mine = json.dumps([{"node": "n1", "step": 2, "phase": "forward", "action": "raise"},
                       {"node": "n1", "step": 3, "phase": "commit", "action": "raise"}])  # fmt: skip
    seen = probe(mine)
    assert seen["injector_loaded"] is True
    assert seen["phases"] == ["commit", "forward"]
    assert seen["model_hooks"] == 1 and seen["optimizer_hooks"] == 0
