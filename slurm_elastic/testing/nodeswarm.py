"""Many simulated nodes in one process: each an agent's connection and its control relay's (its workers')
to a real coordinator, over real sockets and the real handshake, for `bench coordinator`.

They speak as the production peers do: an agent registers its node and heartbeats; its relay carries its
workers (controlrelay): each registers, its heartbeats go up together once an interval, it steps every
`--step-s`, and rank 0 reports each commit; a worker asked for a boundary reports reaching it at its next
step; a worker told to leave, or stopped, closes.
Frames are read as plain JSON (a client this lean leaves the machine's CPU to the coordinator under test).

Run as `python -m slurm_elastic.testing.nodeswarm` by the benchmark, never imported by the runtime. The
secret comes in SLURM_ELASTIC_SECRET. It reads one JSON command per stdin line (`kill`, `silence`, `drain`,
`join` a node; `report`; `quit`) and answers each with one JSON line. Times are time.monotonic(), one clock
for every process of the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from slurm_elastic.wire.channel import encode_frame, open_peer
from slurm_elastic.wire.messages import (
    AtBoundary,
    Beats,
    Committed,
    DrainRequest,
    Heartbeat,
    Register,
    RegisterNode,
    RelayClosed,
    Relayed,
)

__all__ = ["main"]

_HEADER = struct.Struct("!I")


@dataclass
class Connection:
    """One connection of a simulated node: its agent's, or its relay's (every worker of the node on it)."""

    node: SimNode
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def send(self, frame: bytes) -> bool:
        if self.node.silent or self.writer.is_closing():
            return False
        self.writer.write(frame)
        return True


@dataclass
class SimWorker:
    name: str
    generation: int = 0
    rank: int = -1
    step: int = 0
    boundary_asked: int = 0  # the generation whose boundary the coordinator asked for
    closed: bool = False


@dataclass
class SimNode:
    name: str
    workers: dict[str, SimWorker] = field(default_factory=dict)
    connections: list[Connection] = field(default_factory=list)  # the agent's, then the relay's
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    silent: bool = False
    closed_at: float | None = None  # when the coordinator closed its agent's connection
    roster: list[str] = field(default_factory=list)  # the whole ranks of the latest generation sent whole

    def relayed(self, worker: str, message: BaseModel) -> bytes:
        return encode_frame(Relayed(worker=worker, frame=message.model_dump_json()))


@dataclass
class Generation:
    """What this process saw of one generation's announcement."""

    first: float
    last: float
    count: int
    world: int
    left: list[str]
    joined: list[str]


class Swarm:
    def __init__(self, args: argparse.Namespace, secret: str) -> None:
        self.args, self.secret = args, secret
        self.nodes: dict[str, SimNode] = {}
        self.generations: dict[int, Generation] = {}
        self.ranks: dict[int, list[str]] = {}  # resolved ranks of recent generations, shared by this process
        self.sent = self.received = 0
        self.heartbeat_s = args.heartbeat_s

    # --- peers ----------------------------------------------------------------------------------------

    async def add_node(self, name: str) -> None:
        node = SimNode(name)
        reader, writer = await open_peer(self.args.address, self.secret, self.args.job, "agent")
        register = RegisterNode(node=name, host=name, nproc=self.args.workers, pid=os.getpid(), slurm_job_id="1")
        writer.write(encode_frame(register))
        agent = Connection(node, reader, writer)
        reader, writer = await open_peer(self.args.address, self.secret, self.args.job, "relay")
        relay = Connection(node, reader, writer)
        node.connections = [agent, relay]
        self.nodes[name] = node  # the stepper sees it from now on
        for local in range(self.args.workers):
            wid = f"{name}-{local}"
            node.workers[wid] = SimWorker(wid)
            relay.send(
                node.relayed(wid, Register(worker_id=wid, node=name, local_rank=local, pid=0, committed_step=-1))
            )
        loop = asyncio.get_running_loop()
        node.tasks = [
            loop.create_task(self._read(agent, agent=True)),
            loop.create_task(self._read(relay, agent=False)),
            loop.create_task(self._heartbeat(node)),
        ]

    def close_node(self, node: SimNode) -> None:
        for connection in node.connections:
            connection.writer.close()

    # --- what each node does --------------------------------------------------------------------------

    async def _heartbeat(self, node: SimNode) -> None:
        """The agent's heartbeat, and its relay's frame of its workers' heartbeats, once an interval each."""
        await asyncio.sleep(random.uniform(0, self.heartbeat_s))  # nodes' heartbeats are not in step
        agent, relay = node.connections
        while not agent.writer.is_closing():
            self.sent += agent.send(encode_frame(Heartbeat(generation=0, step=-1, phase="init")))
            beats = [(w.name, w.generation, w.step, "compute") for w in node.workers.values() if not w.closed]
            if beats:
                self.sent += relay.send(encode_frame(Beats(beats=beats)))
            await asyncio.sleep(self.heartbeat_s)

    async def _read(self, connection: Connection, agent: bool) -> None:
        node = connection.node
        try:
            while True:
                (length,) = _HEADER.unpack(await connection.reader.readexactly(_HEADER.size))
                message = json.loads(await connection.reader.readexactly(length))
                self.received += 1
                if agent:
                    if message["type"] == "stop":
                        break
                elif message["type"] == "relayed":
                    self._on_message(node, node.workers[message["worker"]], json.loads(message["frame"]))
                elif message["type"] == "roster":
                    node.roster = message["ranks"]
                elif message["type"] == "assigns":
                    whole = {"ranks": node.roster} if message["since"] is None else {}
                    assign = {**message, "type": "assign", **whole}
                    for worker, rank in message["members"]:
                        self._on_assign(node.workers[worker], {**assign, "rank": rank})
                elif message["type"] == "relay_closed":
                    self._leave(node, node.workers[message["worker"]])
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if agent and node.closed_at is None:
                node.closed_at = time.monotonic()
            connection.writer.close()

    def _on_message(self, node: SimNode, worker: SimWorker, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "registered":
            self.heartbeat_s = message["settings"]["heartbeat_interval_s"]  # the production interval
        elif kind == "assign":
            self._on_assign(worker, message)
        elif kind == "change_pending":
            worker.boundary_asked = max(worker.boundary_asked, message["generation"])
        elif kind in ("leave", "stop"):
            self.sent += node.connections[1].send(encode_frame(RelayClosed(worker=worker.name)))
            self._leave(node, worker)

    def _leave(self, node: SimNode, worker: SimWorker) -> None:
        worker.closed = True
        if all(w.closed for w in node.workers.values()):
            self.close_node(node)  # an agent ends once its workers have left

    def _on_assign(self, worker: SimWorker, a: dict[str, Any]) -> None:
        now, number = time.monotonic(), a["generation"]
        if number not in self.ranks:
            if a["since"] is None:
                self.ranks[number] = a["ranks"]
            else:
                gone = set(a["left"])
                self.ranks[number] = [w for w in self.ranks[a["since"]] if w not in gone] + a["joined"]
            for old in [g for g in self.ranks if g < number - 8]:
                del self.ranks[old]
        gen = self.generations.get(number)
        if gen is None:
            gen = self.generations[number] = Generation(now, now, 0, len(self.ranks[number]), [], [])
        if a["since"] is not None and not gen.left and not gen.joined:
            gen.left, gen.joined = a["left"], a["joined"]
        gen.last, gen.count = now, gen.count + 1
        worker.generation, worker.rank = number, a["rank"]

    async def step(self) -> None:
        """Every worker steps at once, as a data-parallel job does."""
        while True:
            await asyncio.sleep(self.args.step_s)
            for node in self.nodes.values():
                relay = node.connections[1]
                for worker in node.workers.values():
                    if worker.generation > 0 and not worker.closed and not relay.writer.is_closing():
                        self._step(node, relay, worker)

    def _step(self, node: SimNode, relay: Connection, worker: SimWorker) -> None:
        """One step of one worker: rank 0 reports the commit; a boundary asked for is reached."""
        worker.step += 1
        gen = worker.generation
        if worker.rank == 0:
            world = len(self.ranks.get(gen, ())) or 1
            done = Committed(generation=gen, step=worker.step, loss=1.0, samples=world, world=world, time=time.time())
            self.sent += relay.send(node.relayed(worker.name, done))
        if worker.boundary_asked >= gen:
            self.sent += relay.send(node.relayed(worker.name, AtBoundary(generation=gen, step=worker.step)))
            worker.boundary_asked = 0

    # --- commands -------------------------------------------------------------------------------------

    async def command(self, line: str) -> dict[str, Any]:
        c = json.loads(line)
        do, node = c["do"], self.nodes.get(c.get("node", ""))
        now = time.monotonic()
        if do == "report":
            return self.report()
        if do == "join":
            await self.add_node(c["node"])
            return {"joined": c["node"], "t": now}
        if node is None:
            return {"error": f"no node {c.get('node')!r} here"}
        if do == "kill":
            self.close_node(node)
        elif do == "silence":
            node.silent = True
        elif do == "drain":
            drain = DrainRequest(nodes=[node.name], mode="boundary", reason="bench", source="agent")
            self.sent += node.connections[0].send(encode_frame(drain))
        else:
            return {"error": f"unknown command {do!r}"}
        return {do: node.name, "t": now}

    def report(self) -> dict[str, Any]:
        return {
            "t": time.monotonic(),
            "sent": self.sent,
            "received": self.received,
            "generations": {g: vars(gen) for g, gen in self.generations.items()},
            "closed": {n.name: n.closed_at for n in self.nodes.values() if n.closed_at is not None},
        }


async def _main(args: argparse.Namespace) -> None:
    swarm = Swarm(args, os.environ["SLURM_ELASTIC_SECRET"])
    first, end = (int(x) for x in args.nodes.split(":"))
    for index in range(first, end):  # one at a time: the coordinator admits a bounded number of handshakes
        await swarm.add_node(f"n{index:05d}")
    stepper = asyncio.create_task(swarm.step())
    loop = asyncio.get_running_loop()
    print(json.dumps({"ready": len(swarm.nodes)}), flush=True)
    while (line := await loop.run_in_executor(None, sys.stdin.readline)).strip() not in ("", '{"do": "quit"}'):
        print(json.dumps(await swarm.command(line)), flush=True)
    stepper.cancel()
    for node in swarm.nodes.values():
        swarm.close_node(node)
    with contextlib.suppress(Exception):
        await asyncio.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--nodes", required=True, help="FIRST:END of the node indices this process plays")
    parser.add_argument("--workers", type=int, default=1, help="workers per node")
    parser.add_argument("--step-s", type=float, default=1.0, help="seconds per training step")
    parser.add_argument("--heartbeat-s", type=float, default=1.0, help="until the coordinator's settings say")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection per peer
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
