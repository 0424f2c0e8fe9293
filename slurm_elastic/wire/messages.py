"""Control messages: validated pydantic models, sent as JSON (never pickled).

Every message names its `type`; `parse_message` accepts exactly the union below and rejects the rest.
Generations travel with every message that could arrive late, so a message from generation g can never
be mistaken for one of g+1.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from slurm_elastic.agentspec import LEASE_TIMEOUT_S
from slurm_elastic.errors import ProtocolError

WorkerId = Annotated[str, Field(min_length=1, max_length=200)]
NodeName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:\-\[\],]+$")]
Role = Literal["worker", "agent", "client", "store", "relay"]
Phase = Literal["init", "compute", "allreduce", "optimizer", "commit", "recovery", "boundary", "done"]
DrainMode = Literal["boundary", "now"]


class _Msg(BaseModel):
    # Floats travel as they are: a float16 step that overflowed commits an inf loss (JSON's null would not do).
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")


# --- handshake -------------------------------------------------------------------------------------
# Read before the peer is authenticated: every field has a strict, small shape (lower-case hex only).

JobId = Annotated[str, Field(min_length=1, max_length=200)]
Nonce = Annotated[str, Field(min_length=32, max_length=128, pattern=r"^[0-9a-f]+$")]
Proof = Annotated[str, Field(min_length=64, max_length=64, pattern=r"^[0-9a-f]+$")]


class Challenge(_Msg):
    """Server -> client: a fresh nonce the client's proof must cover."""

    type: Literal["challenge"] = "challenge"
    job_id: JobId
    nonce: Nonce


class Hello(_Msg):
    """Client -> server: its proof of the secret, and a fresh nonce the server's proof must cover."""

    type: Literal["hello"] = "hello"
    role: Role
    job_id: JobId
    nonce: Nonce
    proof: Proof


class Welcome(_Msg):
    """Server -> client: admitted; `proof` shows that the server holds the secret too."""

    type: Literal["welcome"] = "welcome"
    proof: Proof


class Refused(_Msg):
    type: Literal["refused"] = "refused"
    reason: str = Field(max_length=200)


# --- worker -> coordinator --------------------------------------------------------------------------


class Register(_Msg):
    type: Literal["register"] = "register"
    worker_id: WorkerId
    node: NodeName
    local_rank: int = Field(ge=0)
    pid: int = Field(ge=0)
    committed_step: int = Field(ge=-1)


class Heartbeat(_Msg):
    type: Literal["heartbeat"] = "heartbeat"
    generation: int = Field(ge=0)
    step: int = Field(ge=-1)
    phase: Phase


class Committed(_Msg):
    type: Literal["committed"] = "committed"
    generation: int = Field(ge=1)
    step: int = Field(ge=0)
    loss: float
    samples: int = Field(ge=0)
    world: int = Field(ge=1)
    time: float


class AtBoundary(_Msg):
    type: Literal["at_boundary"] = "at_boundary"
    generation: int = Field(ge=1)
    step: int = Field(ge=0)


class WorkerEvent(_Msg):
    """A structured event observed by a worker (recovery, state transfer, batch policy)."""

    type: Literal["event"] = "event"
    kind: str = Field(min_length=1, max_length=64)
    fields: dict[str, Any] = Field(default_factory=dict)


class Failure(_Msg):
    """An exception raised by the user's own code, reported before the worker exits."""

    type: Literal["failure"] = "failure"
    worker_id: WorkerId
    signature: str = Field(max_length=2000)
    traceback: str = Field(max_length=64_000)
    fatal: bool = False  # a misuse of the job (UsageError): the same script does the same again, so no retry


class CollectiveFault(_Msg):
    """A collective failed but no new generation came: asks the coordinator to re-form the group."""

    type: Literal["collective_fault"] = "collective_fault"
    generation: int = Field(ge=1)
    step: int = Field(ge=0)
    detail: str = Field(max_length=2000)


class StateLost(_Msg):
    """Some of a sharded job's state has no live holder: the job must resume from its checkpoint."""

    type: Literal["state_lost"] = "state_lost"
    generation: int = Field(ge=1)
    step: int = Field(ge=0)
    detail: str = Field(max_length=2000)


class Finished(_Msg):
    """This worker's training loop ended at committed `step`; it waits for the job's answer (a Stop once every
    member's loop ended there, or a new generation to heal peers in)."""

    type: Literal["finished"] = "finished"
    generation: int = Field(ge=1)
    step: int = Field(ge=0)
    how: str = Field(default="", max_length=300)


class StopAsked(_Msg):
    """`job.stop()`: end every member's loop at the next step boundary."""

    type: Literal["stop_asked"] = "stop_asked"
    reason: str = Field(default="job.stop()", max_length=300)


LoopValue = int | float | str | bool | None


class LoopOpened(_Msg):
    """The settings this worker's training loop runs with; every member's must be the same."""

    type: Literal["loop_opened"] = "loop_opened"
    settings: dict[Annotated[str, Field(max_length=64)], LoopValue] = Field(max_length=32)


# --- coordinator -> worker --------------------------------------------------------------------------


class WorkerSettings(_Msg):
    heartbeat_interval_s: float = Field(gt=0)
    lease_timeout_s: float = Field(default=LEASE_TIMEOUT_S, gt=0)  # the coordinator silent this long: it is gone
    pg_timeout_s: float = Field(gt=0)
    backend: Literal["auto", "gloo", "nccl"]
    store_prefix: str  # the rendezvous store is the coordinator's: reached at its address, role "store"
    load_checkpoint: bool = False  # only workers of the job's first generation; joiners heal from peers
    run: int = Field(default=0, ge=0)  # how many times the whole job was restarted (Slurm requeues)


class Registered(_Msg):
    type: Literal["registered"] = "registered"
    settings: WorkerSettings


class Assign(_Msg):
    """Generation `generation` begins: abruptly (`boundary_step` None) or after `boundary_step` commits.

    Its ranks come whole (`ranks`) to a worker new to the job, and to a member of generation `since` as the
    change from that generation's ranks: `left` taken out, `joined` appended. A whole list for every member
    would cost N^2 bytes per generation (200 MB at 4,096 ranks); the change costs what changed.
    """

    type: Literal["assign"] = "assign"
    generation: int = Field(ge=1)
    rank: int = Field(ge=0)
    ranks: list[WorkerId] = Field(default_factory=list)
    since: int | None = Field(default=None, ge=1)
    left: list[WorkerId] = Field(default_factory=list)
    joined: list[WorkerId] = Field(default_factory=list)
    boundary_step: int | None
    cause: str

    @model_validator(mode="after")
    def _whole_or_change(self) -> Assign:
        if (self.since is None) == (not self.ranks):
            raise ValueError("an assign carries either its whole ranks or the change since a generation")
        if self.since is not None and self.since >= self.generation:
            raise ValueError(f"generation {self.generation} cannot be a change since generation {self.since}")
        return self

    def resolved(self, known: Assign | None) -> Assign:
        """This assign with its whole ranks, given the last one this worker resolved (`known`)."""
        if self.since is None:
            return self
        if known is None or known.generation != self.since:
            have = "none" if known is None else f"generation {known.generation}"
            what = f"generation {self.generation} came as a change since {self.since}"
            raise ProtocolError(f"{what}; this worker knows {have}")
        gone = set(self.left)
        ranks = [w for w in known.ranks if w not in gone] + self.joined
        if not 0 <= self.rank < len(ranks) or len(ranks) != len(set(ranks)):
            what = f"generation {self.generation}'s change since {self.since}"
            raise ProtocolError(f"{what} does not give rank {self.rank} of {len(ranks)} unique ranks")
        return self.model_copy(update={"ranks": ranks, "since": None, "left": [], "joined": []})


class ChangePending(_Msg):
    """Membership will change at the next step boundary; raise the flag in the next reduction."""

    type: Literal["change_pending"] = "change_pending"
    generation: int = Field(ge=1)


class Pulse(_Msg):
    """The coordinator is alive: sent to every agent and worker each heartbeat interval, so that a batch host
    that vanished without a TCP reset is noticed within a lease, not after the kernel's retransmissions."""

    type: Literal["pulse"] = "pulse"
    generation: int = Field(ge=0)


class Leave(_Msg):
    type: Literal["leave"] = "leave"
    reason: str


class Stop(_Msg):
    type: Literal["stop"] = "stop"
    reason: str
    error: str | None = None


# --- a node's control relay <-> coordinator ----------------------------------------------------------
# A node's workers open their control connections to their agent's relay (controlrelay), which carries them
# all over one connection of its own: the coordinator holds a connection per node, however many workers.


class Relayed(_Msg):
    """One worker's message, whole, either way: `frame` is its JSON (validated where it is read, as if direct)."""

    type: Literal["relayed"] = "relayed"
    worker: WorkerId
    frame: str


Beat = tuple[WorkerId, Annotated[int, Field(ge=0)], Annotated[int, Field(ge=-1)], Phase]  # generation, step, phase


class Beats(_Msg):
    """Relay -> coordinator: its workers' latest heartbeats, together, once an interval: (worker, generation,
    step, phase) each, plain tuples (thousands a second at the coordinator: no model for each)."""

    type: Literal["beats"] = "beats"
    beats: list[Beat] = Field(max_length=1024)


class Roster(_Msg):
    """Coordinator -> relay: generation `generation`'s whole ranks, once per node (a whole list per worker
    would cost the coordinator N^2 bytes: 13 GB at 32,768 ranks). Its `Assigns` follows."""

    type: Literal["roster"] = "roster"
    generation: int = Field(ge=1)
    ranks: list[WorkerId]


class Assigns(_Msg):
    """Coordinator -> relay: the Assign that each of `members` (worker, rank) is to receive from the relay,
    one message per node and generation: with the roster's whole ranks (`since` None), or as the change
    since generation `since` (`left`, `joined`), which each worker resolves itself."""

    type: Literal["assigns"] = "assigns"
    generation: int = Field(ge=1)
    members: list[tuple[WorkerId, Annotated[int, Field(ge=0)]]]
    since: int | None = Field(default=None, ge=1)
    left: list[WorkerId] = Field(default_factory=list)
    joined: list[WorkerId] = Field(default_factory=list)
    boundary_step: int | None
    cause: str


class RelayClosed(_Msg):
    """A relayed worker's connection ends: up, the worker closed it; down, the coordinator closes it."""

    type: Literal["relay_closed"] = "relay_closed"
    worker: WorkerId


# --- agent <-> coordinator --------------------------------------------------------------------------


class RegisterNode(_Msg):
    type: Literal["register_node"] = "register_node"
    node: NodeName
    host: str
    interface: str | None = Field(default=None, max_length=200)  # of its training groups: "fab0 10.0.0.5 (why)"
    probe: str | None = Field(default=None, max_length=100)  # "ip:port" its peers connect to (`Probe`)
    nproc: int = Field(ge=1, le=1024)
    pid: int = Field(ge=0)
    slurm_job_id: str | None = None


class WorkerExited(_Msg):
    type: Literal["worker_exited"] = "worker_exited"
    worker_id: WorkerId
    returncode: int
    will_restart: bool
    stderr_tail: str = Field(default="", max_length=4000)  # its last words, when it failed or ended for good


class KillWorker(_Msg):
    type: Literal["kill_worker"] = "kill_worker"
    worker_id: WorkerId
    reason: str


class RestartWorkers(_Msg):
    """Checkpoint-restart mode: kill every local worker and start fresh ones."""

    type: Literal["restart_workers"] = "restart_workers"
    reason: str


class HoldNode(_Msg):
    """The node is being given back to Slurm by a shrink: once its workers have left, the agent stays until
    Slurm ends it, the job stops, or `hold_s` has passed."""

    type: Literal["hold_node"] = "hold_node"
    hold_s: float = Field(gt=0, le=3600)


class Probe(_Msg):
    """Try to connect to each of these nodes' probe addresses over the training groups' network."""

    type: Literal["probe"] = "probe"
    round: int = Field(ge=1)
    targets: dict[NodeName, str] = Field(max_length=100_000)  # node -> "ip:port"
    timeout_s: float = Field(gt=0, le=60)


class ProbeResult(_Msg):
    type: Literal["probe_result"] = "probe_result"
    round: int = Field(ge=1)
    unreachable: list[NodeName] = Field(max_length=100_000)


# --- clients (CLI, hooks, agents) -> coordinator ----------------------------------------------------


class DrainRequest(_Msg):
    """Take `nodes` out of the job: at the next step boundary, or now (as if they had failed)."""

    type: Literal["drain"] = "drain"
    nodes: list[NodeName] = Field(min_length=1, max_length=10_000)
    mode: DrainMode = "boundary"
    reason: str = Field(default="requested", max_length=500)
    source: str = Field(default="client", max_length=64)
    # > 0: the nodes go back to Slurm by a shrink, which should find their agents alive (HoldNode).
    hold_s: float = Field(default=0.0, ge=0, le=3600)


class KeepPending(_Msg):
    """Keep `count` satellite jobs pending in the queue, so freed nodes are taken at once (0: stop)."""

    type: Literal["keep_pending"] = "keep_pending"
    count: int = Field(ge=0, le=1000)
    partition: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.\-]{1,64}$")


class StatusRequest(_Msg):
    type: Literal["status"] = "status"


class Ack(_Msg):
    type: Literal["ack"] = "ack"
    ok: bool
    detail: str = ""


class MemberStatus(_Msg):
    worker_id: str
    node: str
    rank: int | None
    step: int
    phase: str
    last_seen_s: float


class StatusReply(_Msg):
    type: Literal["status_reply"] = "status_reply"
    job_id: str
    state: str
    generation: int
    world_size: int
    step: int
    loss: float | None
    samples_per_s: float | None
    nodes: list[str]
    node_jobs: dict[str, str | None] = Field(default_factory=dict)  # node -> the Slurm job its agent runs in
    node_interfaces: dict[str, str | None] = Field(default_factory=dict)  # node -> its groups' interface
    members: list[MemberStatus]
    pending: list[str]
    draining: list[str]
    # registered workers kept out of the job until their node reaches every member again -> that node
    held: dict[str, str] = Field(default_factory=dict)
    events: list[dict[str, Any]]


# --- the rendezvous store (role "store"): torch's Store calls, served by the coordinator ------------------

StoreOp = Literal[
    "set", "get", "add", "compare_set", "wait", "check", "delete_key", "num_keys", "append", "multi_get",
    "multi_set", "list_keys",
]  # fmt: skip
StoreKey = Annotated[str, Field(min_length=1, max_length=512)]
MAX_STORE_ITEMS = 1024


class StoreRequest(_Msg):
    """One call of a torch Store; `values` are base64. Blocking calls (get, wait, multi_get) wait at most
    `timeout_ms` for their keys. Replies carry the request's `id`, so calls of several threads interleave."""

    type: Literal["store"] = "store"
    id: int = Field(ge=0, le=2**53)
    op: StoreOp
    keys: list[StoreKey] = Field(default_factory=list, max_length=MAX_STORE_ITEMS)
    values: list[str] = Field(default_factory=list, max_length=MAX_STORE_ITEMS)
    amount: int = Field(default=0, ge=-(2**62), le=2**62)
    timeout_ms: int = Field(default=0, ge=0, le=86_400_000)


class StoreReply(_Msg):
    type: Literal["store_reply"] = "store_reply"
    id: int = Field(ge=0, le=2**53)
    ok: bool = True
    values: list[str] = Field(default_factory=list, max_length=MAX_STORE_ITEMS)
    number: int = 0
    error: str = Field(default="", max_length=2000)


Message = Annotated[
    Challenge
    | Hello
    | Welcome
    | Refused
    | Register
    | Heartbeat
    | Committed
    | AtBoundary
    | WorkerEvent
    | Failure
    | CollectiveFault
    | StateLost
    | Finished
    | StopAsked
    | LoopOpened
    | Registered
    | Assign
    | ChangePending
    | Pulse
    | Leave
    | Stop
    | Relayed
    | Beats
    | Roster
    | Assigns
    | RelayClosed
    | RegisterNode
    | WorkerExited
    | KillWorker
    | RestartWorkers
    | HoldNode
    | Probe
    | ProbeResult
    | DrainRequest
    | KeepPending
    | StatusRequest
    | Ack
    | StatusReply
    | StoreRequest
    | StoreReply,
    Field(discriminator="type"),
]

_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


def parse_message(data: bytes) -> Message:
    """Validate one JSON frame; raises pydantic.ValidationError on anything else."""
    return _ADAPTER.validate_json(data)


def dump_message(msg: _Msg) -> bytes:
    return msg.model_dump_json().encode()
