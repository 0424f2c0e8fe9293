"""`slurm-elastic chaos --slurm`: a seeded run of mixed faults on the local Slurm cluster, judged against an
uninterrupted run as the local chaos run is.

The job is `elastic_core.sbatch` on every node of the cluster (the first is the batch host). The plan
(`decide.chaos.plan_slurm_chaos`) mixes faults inside training processes (a SIGKILL in a phase of a step, a
hang, a kill while a generation forms or while a joiner receives the state: in the plan the workers read)
with what Slurm and operators do: a node's sudden death (slurmd, step daemons and tasks at once), a shrink
(`scontrol update NumNodes`), a reclaim (`slurm-elastic reclaim`), a satellite preempted by a
higher-priority job, a node drained by an admin, and links cut (a node's, for longer than a lease and for
less; one way between two nodes; and, as the last fault only, the batch host's, after which the job is
requeued and resumes from its checkpoint: with nodes as separate hosts). After each fault the job is
refilled: the launcher
starts an agent on its node again, or a satellite (`slurm-elastic grow`) takes a node that was freed;
the job is led from fault to fault (no step past the next fault's starts; `--until-file` of the paced
example), so that every fault lands at the step the plan names whatever Slurm's delays.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm_elastic.decide.chaos import LINK_KINDS, SLURM_KINDS, ChaosFault, plan_slurm_chaos, steps_needed
from slurm_elastic.errors import ElasticError
from slurm_elastic.events import EventsFile
from slurm_elastic.eventtypes import (
    Commit,
    DrainRequested,
    GenerationReady,
    JobFailed,
    JobFinished,
    MembershipChange,
    NodeLost,
    SlurmJobStarted,
    WorkerRegistered,
    of_kind,
)
from slurm_elastic.jobdir import job_dir, user_name
from slurm_elastic.launch.slurm import satellites_of
from slurm_elastic.showcase.chaos import PAUSE_S, command, fault_plan, fired, verdict
from slurm_elastic.showcase.workload import corpus
from slurm_elastic.slurm import CliBackend
from slurm_elastic.testing.devcluster import LocalCluster
from slurm_elastic.testing.devcluster.shell import tail
from slurm_elastic.waiting import holds_within

CORE = Path(__file__).resolve().parents[2] / "sbatch_templates" / "elastic_core.sbatch"
SLURM_PAUSE_S = 2 * PAUSE_S  # paced, so that a node that takes seconds to start still finds the job running


LEASE_S = 5.0
FLAP_S = 2.0  # a link_flap's cut: under half a lease
CHECKPOINT_EVERY = 10  # a batch host cut replays at most this many steps from the checkpoint


def _settings(root: Path, reduce_dtype: str) -> dict[str, str]:
    return {
        "SLURM_ELASTIC_HOME": str(root / "home"),
        "SLURM_ELASTIC_LEDGER_DIR": str(root / "ledger"),
        "SLURM_ELASTIC_REDUCE_DTYPE": reduce_dtype,
        "SLURM_ELASTIC_HEARTBEAT_INTERVAL_S": "0.5",
        "SLURM_ELASTIC_LEASE_TIMEOUT_S": str(LEASE_S),
        "SLURM_ELASTIC_HANG_TIMEOUT_S": "5",
        "SLURM_ELASTIC_PG_TIMEOUT_S": "10",  # how long a one-way cut stays unseen (a collective's timeout)
        "SLURM_ELASTIC_PROGRESS_INTERVAL_S": "0.5",
        "SLURM_ELASTIC_CHECKPOINT_EVERY": str(CHECKPOINT_EVERY),
        "SLURM_ELASTIC_RECORD_COMMITS": "true",  # one event per committed step: where the job is, exactly
        "SLURM_ELASTIC_NODE_WATCH_INTERVAL_S": "1",
        "SLURM_ELASTIC_MAX_RESTARTS": "0",  # a node whose worker died comes back through a new agent
        "OMP_NUM_THREADS": "1",
        "SE_PYTHON": sys.executable,
    }


def held_step(events: list[dict[str, Any]]) -> int:
    """The newest step the job holds. A `commit` record is rank 0's own commit; when a fault struck between
    the ranks' commits of a step, rank 0 takes that step from a peer as the next generation forms, and only
    that generation's `resume_step` says so."""
    steps = [c.step for c in of_kind(events, Commit)]
    steps += [g.resume_step for g in of_kind(events, GenerationReady)]
    return max(steps, default=0)


class _Job(EventsFile):
    """The core job, seen through its events file and Slurm, and the actions of the plan upon it."""

    def __init__(self, cluster: LocalCluster, root: Path, env: dict[str, str], job_id: str, until: Path) -> None:
        super().__init__(job_dir(job_id, Path(env["SLURM_ELASTIC_HOME"])) / "events.jsonl", f"chaos job {job_id}")
        self.cluster, self.root, self.env, self.job_id, self.until = cluster, root, env, job_id, until
        self.backend = CliBackend(env=cluster.command_env())
        self.size = len(cluster.nodes)
        self.others: list[str] = []  # jobs the chaos run submitted (preempting jobs), cancelled at the end
        self.bound: int | None = None  # no step numbered above it starts

    # --- what the job is doing --------------------------------------------------------------------------

    def last_step(self) -> int:
        return held_step(self.events())

    def members(self) -> set[str]:
        changes = self.of(MembershipChange)
        return {w.split(":")[0] for w in changes[-1].ranks} if changes else set()

    def registered(self) -> set[str]:
        """Nodes whose worker is there, ready to join: registered, and neither its agent lost nor its worker
        out of the job since (the membership change shows a loss before the agent's end does)."""
        nodes: set[str] = set()
        for record in self.events():
            match record.get("event"):
                case WorkerRegistered.KIND:
                    nodes.add(WorkerRegistered.from_event(record).node)
                case NodeLost.KIND:
                    nodes.discard(NodeLost.from_event(record).node)
                case MembershipChange.KIND:
                    nodes -= {w.split(":")[0] for w in MembershipChange.from_event(record).left}
        return nodes

    def ready(self) -> bool:
        """The latest generation formed, and its state transfer ended (done, or failed by a fault)."""
        changes, ready = self.of(MembershipChange), self.of(GenerationReady)
        return not changes or any(e.generation >= changes[-1].generation for e in ready)

    def left_since(self, since: float) -> list[str]:
        """Nodes whose workers left the job (failed, evicted, drained) in membership changes after `since`."""
        return [w.split(":")[0] for e in self.of(MembershipChange) if e.time >= since for w in e.left]

    def ended(self) -> bool:
        """Finished, or failed in its latest run (a run stopped by a batch host cut is followed by another)."""
        started = max((e.time for e in self.of(SlurmJobStarted)), default=0.0)
        return bool(self.of(JobFinished)) or any(e.time >= started for e in self.of(JobFailed))

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 180.0) -> None:
        def alive_and(predicate: Callable[[], bool]) -> bool:
            if self.ended():
                raise ElasticError(f"chaos: waiting for {what}: the job ended; output:\n{self.output()[-3000:]}")
            return predicate()

        super().wait(what, lambda: alive_and(predicate), timeout)

    def wait_finished(self) -> None:
        super().wait("the job to end", lambda: self.backend.job(self.job_id).is_finished, 1800)

    def output(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.root.glob(f"*-{self.job_id}.out")))

    def satellites(self) -> list[str]:
        return [j.job_id for j in satellites_of(self.backend, self.job_id, user_name())]

    # --- actions --------------------------------------------------------------------------------------

    def slurm(self, *argv: str) -> str:
        return self.cluster.slurm(*argv, timeout_s=60.0).stdout

    def elastic(self, *args: str) -> subprocess.Popen[str]:
        """`slurm-elastic ARGS --job ID`, started; without the fault plan (a satellite must not fire the
        core job's faults)."""
        cmd = [sys.executable, "-m", "slurm_elastic", *args, "--job", self.job_id]
        env = {k: v for k, v in self.env.items() if not k.startswith("SLURM_ELASTIC_FAULTS")}
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    @staticmethod
    def finished(command: subprocess.Popen[str]) -> str:
        out, _ = command.communicate(timeout=180)
        if command.returncode != 0:
            raise ElasticError(f"chaos: `slurm-elastic {' '.join(command.args[3:])}` failed: {out}")  # type: ignore[index, arg-type]
        return out

    def drained_since(self, since: float, node: str | None) -> bool:
        return any(e.time >= since and (node is None or node in e.nodes) for e in self.of(DrainRequested))

    def allow(self, step: int | None) -> None:
        """No step numbered above `step` starts (None: no bound). Written whole, then renamed into place."""
        self.bound = step
        if step is None:
            self.until.unlink(missing_ok=True)
            return
        staged = self.until.with_suffix(".new")
        staged.write_text(str(step))
        staged.replace(self.until)

    def wait_stepping(self, what: str, predicate: Callable[[], bool]) -> None:
        """Wait for what happens at a step boundary (a drain leaves, a joiner joins), letting the job on one
        step at a time: the change rides in a step's last reduction, so it may take a step or two to show."""

        def stepped() -> bool:
            if predicate():
                return True
            last = self.last_step()
            if self.bound is not None and last >= self.bound:
                self.allow(last + 1)
            return False

        self.wait(what, stepped)

    def refill(self) -> list[str]:
        """Back to every node of the cluster: no step starts until the newcomers registered. A node's own
        agent comes back by itself (the launcher starts it again); a node that was freed gets a satellite."""
        joined: list[str] = []
        for _ in range(3):  # a transfer fault may strike the refill's own join: then refill again
            if len(self.members()) >= self.size:
                return joined
            before = self.members()
            grown = 0.0
            deadline = time.monotonic() + 240
            while len(self.registered()) < self.size:
                if time.monotonic() > deadline:
                    raise ElasticError(f"chaos: the job did not get back to {self.size} nodes within 240 s")
                idle = [n for n, s in self.cluster.node_states().items() if s == "idle"]
                pending = [s for s in self.satellites() if self.backend.job(s).is_pending]
                if idle and not pending and time.monotonic() - grown > 30:
                    self.finished(self.elastic("grow", "--nodes", "1", "--partition", "train"))
                    grown = time.monotonic()
                time.sleep(0.5)
            # The next generation after the last registration (the newcomers in; or someone lost while they
            # were let in), in sync. Not after this poll: a joiner may be let in at a step still in flight.
            crossed = max(e.time for e in self.of(WorkerRegistered))
            self.wait_stepping("the next generation", lambda t=crossed: self.changed_since(t) and self.ready())  # type: ignore[misc]
            joined += sorted(self.members() - before)
        return joined

    def changed_since(self, since: float) -> bool:
        return any(e.time >= since for e in self.of(MembershipChange))


class _Runner:
    def __init__(self, job: _Job, struck: Callable[[], list[bool]], log: Callable[[str], None]) -> None:
        self.job, self.struck, self.log = job, struck, log
        self.hit: list[str | None] = []  # the node each fault actually hit
        self.joins: list[str] = []
        self.armed: tuple[int, ChaosFault, float] | None = None  # a recovery or transfer fault, not yet followed
        self.replayed: list[int] = []  # steps each batch host cut replayed from the checkpoint

    def apply(self, fault: ChaosFault) -> None:
        """Lead the job to the fault's step (a fault inside the training strikes in the step after it), carry
        the fault out, wait its node out and refill. The job never runs ahead of the plan."""
        job = self.job
        inside = fault.kind in ("worker_kill", "hang")
        since = time.time()  # before the step: a fault inside the training may strike before this sees it
        job.allow(fault.step + 1 if inside else fault.step)
        job.wait(f"step {fault.step}", lambda: job.last_step() >= fault.step)
        node = fault.node
        self.log(f"chaos: step {fault.step}: {fault.kind} of {node or 'a satellite'}" + (
            f" in {fault.phase}" if fault.phase else "") + (f" to {fault.peer}" if fault.peer else ""))  # fmt: skip
        if fault.kind == "link_flap":
            self._flap(node or "", since)
            self.hit.append(node)
            return
        if fault.kind == "batch_host_cut":
            self._cut_batch_host(node or "", since)
            self.hit.append(node)
            return
        if fault.kind in ("recovery_fault", "transfer_fault"):
            self.hit.append(node)  # armed: strikes in its successor's recovery or join
            self.armed = (len(self.hit) - 1, fault, since)
            return
        if inside:
            index = len(self.hit)

            def missed() -> bool:
                """Not fired though the step after its own committed. Its own step committing is not enough:
                a fault late in a step (its commit) strikes after the others' commit of that step shows."""
                if self.struck()[index] or job.last_step() <= fault.step:
                    return False
                if job.bound is not None and job.bound <= fault.step + 1:
                    job.allow(fault.step + 2)
                return job.last_step() > fault.step + 1 and not self.struck()[index]

            job.wait(f"{node} to leave after its {fault.kind}", lambda: bool(self._left(since, node)) or missed())
            if missed():  # its node was not in the job at that step (the record says so in the summary)
                self.log(f"chaos: the {fault.kind} of {node} at step {fault.step} did not fire")
                self.hit.append(node)
                return
        else:
            node = self._act(fault, since) or node
        self.hit.append(node)
        if fault.kind == "node_loss":
            job.cluster.restart_node(node or "")
        elif fault.kind == "partition":
            job.cluster.set_link(node or "", up=True)  # its old agent withdraws; a new one rejoins
        elif fault.kind == "one_way_cut":
            job.cluster.set_route(fault.node or "", fault.peer or "", blocked=False)  # the evicted side rejoins
        elif fault.kind == "drain":
            job.wait(f"{node} drained", lambda: job.cluster.node_states().get(node or "") == "drained", 120)
            job.backend.set_node_state(node or "", "RESUME", "")
        self.joins += job.refill()
        if self.armed is not None:
            self._follow(*self.armed)
            self.armed = None

    def _flap(self, node: str, since: float) -> None:
        """The node's link down for less than a lease, then up: nobody may leave for it."""
        job = self.job
        job.cluster.set_link(node, up=False)
        try:
            time.sleep(FLAP_S)
        finally:
            job.cluster.set_link(node, up=True)
        time.sleep(LEASE_S)  # any eviction it caused has happened by now
        if job.left_since(since):
            raise ElasticError(f"chaos: a link down for {FLAP_S} s (under a lease) lost {job.left_since(since)}")

    def _cut_batch_host(self, node: str, since: float) -> None:
        """The batch host cut off from every other node and from slurmctld: its side must stop without a
        generation of its own (decide.quorum) while the others requeue the job, which then resumes from its
        latest checkpoint (the cut node, marked down by Slurm meanwhile, is rebooted to take work again)."""
        job = self.job
        held, restarts = job.last_step(), job.backend.job(job.job_id).restart_count
        job.cluster.set_link(node, up=False)
        try:  # not job.wait: this run's end is the point
            EventsFile.wait(job, "the batch host's side to stop", lambda: bool(job.of(JobFailed)), 60)
            requeued = lambda: job.backend.job(job.job_id).restart_count > restarts  # noqa: E731
            EventsFile.wait(job, "the other side to requeue the job", requeued, 240)
        finally:
            job.cluster.set_link(node, up=True)
        job.cluster.kill_node(node)
        job.cluster.restart_node(node)
        job.allow(None)  # the plan ends here: the resumed run trains to the end
        EventsFile.wait(job, "the job to run again", lambda: any(e.time >= since for e in job.of(SlurmJobStarted)), 300)
        restart = next(e for e in job.of(SlurmJobStarted) if e.time >= since)
        cut_side = [e.world for e in job.of(MembershipChange) if since <= e.time < restart.time]
        if cut_side:
            raise ElasticError(f"chaos: the batch host's side formed generations of {cut_side} while cut off")
        formed = lambda: [e for e in job.of(GenerationReady) if e.time >= restart.time]  # noqa: E731
        job.wait("the resumed run's first generation", lambda: bool(formed()))
        resumed = formed()[0]
        self.replayed.append(held - resumed.resume_step)
        self.log(f"chaos: requeued onto {', '.join(restart.nodes)}; resumed at step {resumed.resume_step} of {held}")

    def _follow(self, index: int, fault: ChaosFault, since: float) -> None:
        """An armed fault strikes in its successor's recovery or in the state transfer to its joiner, maybe
        after the refill looked: once it is seen to fire, its node is waited out and refilled too."""
        job = self.job
        if holds_within(lambda: self.struck()[index], timeout=10.0, poll=0.2):
            job.wait(f"{fault.node} to leave after its {fault.kind}", lambda: fault.node in job.left_since(since))
            self.joins += job.refill()

    def _act(self, fault: ChaosFault, since: float) -> str:
        """Carry out `fault` and wait until its node left the job; returns that node."""
        job, node = self.job, fault.node
        reclaim: subprocess.Popen[str] | None = None
        if fault.kind == "node_loss":
            job.cluster.kill_node(node or "")
        elif fault.kind == "partition":
            job.cluster.set_link(node or "", up=False)  # up again once it has left (apply)
        elif fault.kind == "one_way_cut":
            job.cluster.set_route(node or "", fault.peer or "", blocked=True)  # mended once one side left
        elif fault.kind == "shrink":
            job.backend.resize_job(job.job_id, num_nodes=len(job.backend.job(job.job_id).nodes) - 1)
        elif fault.kind == "reclaim":
            reclaim = job.elastic("reclaim", "--nodes", "1", "--timeout", "120")
        elif fault.kind == "preempt_satellite":
            out = job.slurm("sbatch", "--parsable", "--partition=infer", "--exclusive", f"--nodelist={node}",
                            "--output=/dev/null", "--wrap=sleep 5")  # fmt: skip
            job.others.append(out.strip().split(";")[0])
        elif fault.kind == "drain":
            job.backend.set_node_state(node or "", "DRAIN", "chaos")
        if fault.kind == "one_way_cut":  # found by the next step's collective: the job must step into it
            job.wait_stepping("a side of the one-way cut to leave", lambda: bool(self._left(since, None)))
        if fault.kind in ("reclaim", "preempt_satellite", "drain"):
            # These leave at a step boundary: once Slurm or the operator asked, the job crosses one.
            job.wait(f"a drain after the {fault.kind}", lambda: job.drained_since(since, node))
            job.wait_stepping(
                f"{node or 'a node'} to leave after its {fault.kind}", lambda: bool(self._left(since, node))
            )
        if fault.kind == "one_way_cut":
            node = None  # either side of the cut may go (decide.reachability chooses)
        if fault.kind in ("shrink", "reclaim"):
            node = None  # Slurm and `reclaim` choose which node goes; the plan expects its core's last
        job.wait(f"{node or 'a node'} to leave after its {fault.kind}", lambda: bool(self._left(since, node)))
        if reclaim is not None:
            job.finished(reclaim)
        return self._left(since, node)[0]

    def _left(self, since: float, node: str | None) -> list[str]:
        left = self.job.left_since(since)
        return [n for n in left if node is None or n == node]


def run_chaos_slurm(
    seed: int, faults: int, *, reduce_dtype: str = "float64", log: Callable[[str], None]
) -> dict[str, Any]:
    cluster = LocalCluster()
    if not cluster.is_up():
        raise ElasticError(f"the local Slurm cluster ({cluster.state_dir}) is not running: `make cluster-up` first")
    os.environ.update(cluster.env())
    started = time.monotonic()
    # A cut link needs nodes that are hosts of their own (the default local cluster).
    kinds = SLURM_KINDS if cluster.net is not None else tuple(k for k in SLURM_KINDS if k not in LINK_KINDS)
    plan = plan_slurm_chaos(seed, faults, nodes=tuple(cluster.nodes), kinds=kinds)
    log(f"chaos --slurm: seed {seed}, {faults} faults over {steps_needed(plan)} steps on {', '.join(cluster.nodes)}")
    cluster.wait_nodes(cluster.nodes, want_idle=True, timeout_s=180)
    root = Path(tempfile.mkdtemp(prefix="slurm-elastic-chaos-slurm-"))
    try:
        summary = _run(cluster, plan, root, reduce_dtype, log)
    except BaseException:
        log(f"chaos --slurm: the job's files are kept in {root} (events in home/jobs/*/*/events.jsonl)")
        for line in _last_lines(root):
            log(line)
        raise
    shutil.rmtree(root, ignore_errors=True)
    return {"seed": seed, **summary, "elapsed_s": round(time.monotonic() - started, 1)}


def _last_lines(root: Path, count: int = 40, width: int = 400) -> list[str]:
    """The end of each job's output (coordinator events, agents' and workers' messages), shortened: what a
    failed run leaves where only its log survives (CI)."""
    lines: list[str] = []
    for out in sorted(root.glob("*.out")):
        last = tail(out, count).splitlines()
        lines += [f"chaos --slurm: {out.name}, last {len(last)} lines:"] + [f"  {t[:width]}" for t in last]
    return lines


def _run(
    cluster: LocalCluster, plan: list[ChaosFault], root: Path, reduce_dtype: str, log: Callable[[str], None]
) -> dict[str, Any]:
    steps = steps_needed(plan)
    data = corpus()
    (root / "fired").mkdir()
    in_job = fault_plan(plan).recorded_in(root / "fired")
    env = {**os.environ, **_settings(root, reduce_dtype), **in_job.to_env()}
    model, until = root / "model.pt", root / "until"
    until.write_text(str(plan[0].step if plan else steps))  # the job waits at the first fault's step
    train = command(data, steps, model, until, pause=SLURM_PAUSE_S, flag="--until-file")
    argv = ["sbatch", "--parsable", f"--nodes={len(cluster.nodes)}", f"--chdir={root}",
            f"--output={root}/core-%j.out", str(CORE), *train]  # fmt: skip
    job_id = subprocess.run(argv, env=env, check=True, capture_output=True, text=True, timeout=30).stdout
    job = _Job(cluster, root, env, job_id.strip().split(";")[0], until)
    runner = _Runner(job, lambda: fired(plan, in_job), log)
    try:
        job.wait(f"the job to train on {job.size} nodes", lambda: len(job.members()) == job.size, 300)
        for fault in plan:
            runner.apply(fault)
        job.allow(None)
        job.wait_finished()
        final = job.backend.job(job.job_id)
    finally:
        if cluster.net is not None:
            for node in cluster.nodes:  # a run stopped mid-partition leaves no node cut off
                cluster.set_link(node, up=True)
                for peer in cluster.nodes:
                    if peer != node:
                        cluster.set_route(node, peer, blocked=False)
        cluster.slurm("scancel", job.job_id, *job.satellites(), *job.others, check=False)
        cluster.recover_nodes()
        cluster.wait_nodes(cluster.nodes, want_idle=True, timeout_s=180)
    if final.state != "COMPLETED" or not model.exists():
        raise ElasticError(f"chaos: the job ended {final.state}; output:\n{job.output()[-3000:]}")
    struck = fired(plan, in_job)
    events = job.events("generation_ready") + job.events("checkpoint_fallback")
    faults_fired = [
        {"step": f.step, "kind": f.kind, "node": node, "phase": f.phase, "fired": hit}
        for f, node, hit in zip(plan, runner.hit, struck, strict=True)
    ]
    summary = verdict(data, steps, model, root, reduce_dtype, events)
    # A batch host cut takes the documented disaster path: the steps since the checkpoint are run again.
    within = all(0 <= r <= CHECKPOINT_EVERY for r in runner.replayed)
    requeued = {"requeues": len(runner.replayed), "requeue_replayed_steps": sum(runner.replayed)}
    return {"slurm": True, "faults": faults_fired, "joins": len(runner.joins), **summary, **requeued,
            "ok": summary["ok"] and within}  # fmt: skip
