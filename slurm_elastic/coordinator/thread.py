"""Runs a Coordinator's event loop on a daemon thread, for launchers, demos and tests in the same process."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.coordinator.peers import PublicView
from slurm_elastic.coordinator.server import Coordinator
from slurm_elastic.wire import messages as msg


class CoordinatorThread:
    """Runs a Coordinator's event loop on a daemon thread; other threads use `view()` and `drain()`."""

    def __init__(self, config: CoordinatorConfig) -> None:
        self.coordinator = Coordinator(config)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="se-coordinator", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            try:
                self._loop.run_until_complete(self.coordinator.start())
            except BaseException as exc:
                self._error = exc
                return
            finally:
                self._ready.set()
            self._loop.run_forever()
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        """Let the loop's remaining tasks see their cancellation, then close it: a loop left open is reported
        (ResourceWarning, its self-pipe sockets) whenever the garbage collector finds it, in whatever code runs."""
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        if tasks:
            self._loop.run_until_complete(asyncio.wait(tasks, timeout=5))
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    def start(self) -> CoordinatorThread:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    @property
    def address(self) -> str:
        return self.coordinator.address

    def view(self) -> PublicView:
        return self.coordinator.view()

    def call(self, fn: Any, *args: Any, timeout: float = 30.0) -> Any:
        """Run `fn(*args)` on the coordinator's loop and return its result (RuntimeError once it is closed)."""
        if self._loop.is_closed():
            raise RuntimeError("the coordinator's loop is closed")

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=timeout)

    def drain(self, nodes: list[str], mode: msg.DrainMode = "boundary", reason: str = "requested") -> msg.Ack:
        return self.call(
            self.coordinator._on_drain, msg.DrainRequest(nodes=nodes, mode=mode, reason=reason, source="local")
        )

    def status(self) -> msg.StatusReply:
        return self.call(self.coordinator.status)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return

        async def shutdown() -> None:
            coord = self.coordinator
            if coord._ticker_task is not None:
                coord._ticker_task.cancel()
            coord.connections.close()
            for peer in (*coord.workers.values(), *coord.agents.values()):
                peer.writer.close()
            for relay in coord.relays:
                relay.close()
            coord.store.close()
            coord.report_refusals()  # the last interval's, not left unsaid

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
