"""Many simulated ranks in one process: lightweight asyncio clients of a real coordinator, over real sockets
and the real handshake, for benchmarks that need thousands of peers on one machine (`bench rendezvous`).

Run as `python -m slurm_elastic.testing.swarm` by a benchmark, never imported by the runtime. The job's
secret comes in the environment (SLURM_ELASTIC_SECRET); the process reads one line from stdin per round
("go"), runs the round's pattern for its ranks, and prints one JSON line: when its first request left and
its last reply came (time.monotonic(), one clock for every process of the machine), and the ops it sent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import sys
import time
from dataclasses import dataclass, field

from slurm_elastic.errors import ProtocolError
from slurm_elastic.rendezvous.relay import Upstream
from slurm_elastic.rendezvous.service import decode_value, encode_value
from slurm_elastic.wire.channel import open_peer, read_message, write_message
from slurm_elastic.wire.messages import StoreOp, StoreReply, StoreRequest

__all__ = ["RelayedRank", "StoreRank", "open_node", "open_store"]

UNIQUE_ID_BYTES = 128  # an ncclUniqueId
ADDRESS_BYTES = 64  # a gloo rank's serialized address, about


@dataclass
class StoreRank:
    """One simulated rank's store connection: requests go out at once, replies are matched by id."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    ids: int = 0
    waiting: dict[int, asyncio.Future[StoreReply]] = field(default_factory=dict)

    async def call(
        self, op: StoreOp, keys: list[str], values: tuple[bytes, ...] = (), timeout_ms: int = 60_000
    ) -> list[bytes]:
        self.ids += 1
        reply: asyncio.Future[StoreReply] = asyncio.get_running_loop().create_future()
        request = StoreRequest(
            id=self.ids, op=op, keys=keys, values=[encode_value(v) for v in values], timeout_ms=timeout_ms
        )
        self.send(request, reply)
        answer = await reply
        if not answer.ok:
            raise ProtocolError(f"store {op} {keys[:1]}: {answer.error}")
        return [decode_value(v) for v in answer.values]

    def send(self, request: StoreRequest, reply: asyncio.Future[StoreReply]) -> None:
        self.waiting[request.id] = reply
        write_message(self.writer, request)

    async def read_replies(self) -> None:
        while True:
            message = await read_message(self.reader)
            if isinstance(message, StoreReply) and message.id in self.waiting:
                self.waiting.pop(message.id).set_result(message)


@dataclass
class RelayedRank(StoreRank):
    """A simulated rank of a node whose store connections end at the node's relay: its requests go through
    the relay's real `Upstream` (merging included), handed over in this process; the hop from a worker to
    its node's relay, which each node pays on its own cores, is not played."""

    upstream: Upstream | None = None

    def send(self, request: StoreRequest, reply: asyncio.Future[StoreReply]) -> None:
        assert self.upstream is not None
        self.upstream.call(request, reply.set_result)


async def open_store(address: str, secret: str, job_id: str) -> StoreRank:
    """An authenticated store connection."""
    return StoreRank(*await open_peer(address, secret, job_id, "store"))


async def open_node(address: str, secret: str, job_id: str, ranks: int) -> tuple[Upstream, list[RelayedRank]]:
    """`ranks` simulated ranks of one node, behind its relay's one connection to the coordinator's store."""
    upstream = Upstream(*await open_peer(address, secret, job_id, "store"))
    return upstream, [RelayedRank(upstream.reader, upstream.writer, upstream=upstream) for _ in range(ranks)]


async def _round(ranks: dict[int, StoreRank], pattern: str, world: int, prefix: str) -> dict[str, float | int]:
    """One generation's group, formed by `ranks` (of `world`): `nccl`, rank 0 publishes one unique id and
    every other rank gets it; `gloo`, every rank publishes its address, then waits for and gets every rank's."""
    sent = 0

    async def nccl(rank: int, conn: StoreRank) -> None:
        nonlocal sent
        key = f"{prefix}/nccl/uid"
        sent += 1
        if rank == 0:
            await conn.call("set", [key], (secrets.token_bytes(UNIQUE_ID_BYTES),))
        else:
            await conn.call("get", [key])

    async def gloo(rank: int, conn: StoreRank) -> None:  # as ProcessGroupGloo's full mesh: N + 2 N^2 in all
        nonlocal sent
        sent += 1 + 2 * world
        await conn.call("set", [f"{prefix}/gloo/{rank}"], (secrets.token_bytes(ADDRESS_BYTES),))
        for peer in range(world):
            await conn.call("wait", [f"{prefix}/gloo/{peer}"])
            await conn.call("get", [f"{prefix}/gloo/{peer}"])

    run = nccl if pattern == "nccl" else gloo
    started = time.monotonic()
    await asyncio.gather(*(run(rank, conn) for rank, conn in ranks.items()))
    return {"started": started, "ended": time.monotonic(), "ops": sent}


async def _main(args: argparse.Namespace) -> None:
    secret = os.environ["SLURM_ELASTIC_SECRET"]
    first, last = (int(x) for x in args.ranks.split(":"))
    ranks: dict[int, StoreRank] = {}
    readers = []
    # One connection at a time: the coordinator admits a bounded number of handshakes.
    if args.per_node:
        for node_first in range(first, last, args.per_node):
            upstream, node = await open_node(args.address, secret, args.job, min(args.per_node, last - node_first))
            ranks.update(zip(range(node_first, last), node, strict=False))
            readers.append(asyncio.create_task(upstream.read_replies()))
    else:
        for rank in range(first, last):
            ranks[rank] = await open_store(args.address, secret, args.job)
        readers = [asyncio.create_task(conn.read_replies()) for conn in ranks.values()]
    loop = asyncio.get_running_loop()
    print(json.dumps({"ready": len(ranks)}), flush=True)
    for generation in range(1, args.rounds + 1):
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if line.strip() != "go":
            break
        result = await _round(ranks, args.pattern, args.world, f"{args.prefix}/g{generation}")
        print(json.dumps(result), flush=True)
    for task in readers:
        task.cancel()
    for conn in ranks.values():
        conn.writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--ranks", required=True, help="FIRST:END of the world's ranks this process plays")
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--pattern", choices=("nccl", "gloo"), required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--prefix", default="rdzv", help="the store's generation keys start <prefix>/g<N>/")
    parser.add_argument("--per-node", type=int, default=0, help="ranks per node behind one relay (0: none)")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection per rank
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
