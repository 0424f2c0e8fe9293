"""What recovery relies on from NCCL, probed raw on one GPU: a communicator whose peer died is aborted
without waiting for the collective's timeout, and the survivors form the next generation's communicator
in the same processes.

    python tests/device/nccl_probe.py --world 3      # prints one JSON line per surviving rank

Not part of the suite (CI has no GPU): tests/device/nccl_checks.sh runs it on a GPU machine. Every rank
sits on the same GPU; each names its own NCCL host (NCCL_HOSTID), so NCCL connects them over sockets
instead of refusing a duplicate GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def form(store: dist.Store, generation: int, rank: int, world: int) -> dist.ProcessGroup:
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = datetime.timedelta(seconds=60)  # far longer than the probe waits: a timeout is no answer
    return dist.ProcessGroupNCCL(dist.PrefixStore(f"g{generation}", store), rank, world, opts)


def wait_done(future: torch.futures.Future, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not future.done() and time.monotonic() < end:
        time.sleep(0.01)
    return future.done()


def rank_main(rank: int, world: int, port: int, results: mp.Queue) -> None:
    os.environ["NCCL_HOSTID"] = f"probe-rank-{rank}"
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"  # as the library sets it: it aborts, not the watchdog
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=60))
    report: dict[str, object] = {"rank": rank}
    started = time.monotonic()
    pg = form(store, 0, rank, world)
    t = torch.ones(1 << 20, device="cuda")
    pg.allreduce([t]).wait()
    torch.cuda.synchronize()
    report["g0_formed_and_reduced_s"] = round(time.monotonic() - started, 3)
    report["g0_sum_ok"] = bool((t == world).all())
    dying = world - 1
    store.set(f"ready/{rank}", "1")
    if rank == dying:
        store.wait([f"ready/{r}" for r in range(world)])
        os._exit(0)  # the failure: a peer gone in the middle of the next collective
    time.sleep(0.5)
    work = pg.allreduce([t])
    future = work.get_future()
    report["done_without_abort_in_3s"] = wait_done(future, 3.0)
    begun = time.monotonic()
    pg.abort()
    report["abort_returned_s"] = round(time.monotonic() - begun, 3)
    report["done_within_10s_of_abort"] = wait_done(future, 10.0)
    try:
        work.wait()
        report["aborted_wait"] = "returned"
    except Exception as exc:  # the probe reports whatever the aborted collective raised
        report["aborted_wait"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    survivors = world - 1
    begun = time.monotonic()
    pg1 = form(store, 1, rank, survivors)
    u = torch.full((1 << 20,), float(rank + 1), device="cuda")
    pg1.allreduce([u]).wait()
    torch.cuda.synchronize()
    report["g1_formed_and_reduced_s"] = round(time.monotonic() - begun, 3)
    report["g1_sum_ok"] = bool((u == survivors * (survivors + 1) / 2).all())
    results.put(report)
    pg1.abort()
    os._exit(0)  # the aborted group's destructor may wait for its collective: the report is out already


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=3, help="ranks on the one GPU (at least 3: two survive)")
    args = p.parse_args()
    if args.world < 3:
        print(f"nccl_probe: --world {args.world}: needs at least 3", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("nccl_probe: no CUDA device here", file=sys.stderr)
        return 2
    print(json.dumps({"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}))
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args.world, port, results)) for r in range(args.world)]
    for proc in procs:
        proc.start()
    reports = []
    try:
        for _ in range(args.world - 1):
            reports.append(results.get(timeout=120))
    except queue.Empty:
        print(json.dumps({"error": f"{args.world - 1 - len(reports)} surviving rank(s) reported nothing in 120 s"}))
    for proc in procs:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    for report in sorted(reports, key=lambda r: int(r["rank"])):
        print(json.dumps(report))
    healed = all(r["g0_sum_ok"] and r["g1_sum_ok"] and r["done_within_10s_of_abort"] for r in reports)
    ok = len(reports) == args.world - 1 and healed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
