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
import hmac
import json
import os
import resource
import secrets
import sys
import time
from dataclasses import dataclass, field

from slurm_elastic.errors import AuthError, ProtocolError
from slurm_elastic.rendezvous.service import decode_value, encode_value
from slurm_elastic.wire.channel import parse_address, proof, read_message, server_proof, write_message
from slurm_elastic.wire.messages import Challenge, Hello, Role, StoreOp, StoreReply, StoreRequest, Welcome

__all__ = ["StoreRank", "open_peer", "open_store"]

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
        self.waiting[self.ids] = reply
        request = StoreRequest(
            id=self.ids, op=op, keys=keys, values=[encode_value(v) for v in values], timeout_ms=timeout_ms
        )
        write_message(self.writer, request)
        answer = await reply
        if not answer.ok:
            raise ProtocolError(f"store {op} {keys[:1]}: {answer.error}")
        return [decode_value(v) for v in answer.values]

    async def read_replies(self) -> None:
        while True:
            message = await read_message(self.reader)
            if isinstance(message, StoreReply) and message.id in self.waiting:
                self.waiting.pop(message.id).set_result(message)


async def open_peer(
    address: str, secret: str, job_id: str, role: Role
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection in `role` that proved the secret and checked the coordinator's proof, as a worker's does."""
    host, port = parse_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    challenge = await read_message(reader)
    if not isinstance(challenge, Challenge) or challenge.job_id != job_id:
        raise AuthError(f"{address} is not job {job_id}'s coordinator")
    mine = secrets.token_hex(16)
    write_message(
        writer, Hello(role=role, job_id=job_id, nonce=mine, proof=proof(secret, challenge.nonce, role, job_id))
    )
    welcome = await read_message(reader)
    expected = server_proof(secret, mine, challenge.nonce, role, job_id)
    if not isinstance(welcome, Welcome) or not hmac.compare_digest(expected, welcome.proof):
        raise AuthError(f"{address} did not prove job {job_id}'s secret")
    return reader, writer


async def open_store(address: str, secret: str, job_id: str) -> StoreRank:
    """An authenticated store connection."""
    return StoreRank(*await open_peer(address, secret, job_id, "store"))


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
    for rank in range(first, last):  # one at a time: the coordinator admits a bounded number of handshakes
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
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection per rank
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
