"""Worker processes for measurement: a child that answers requests over a pipe, killed and restarted
at will (docs/search.md#measurement).

Builders and the runner are both `Worker`s running `serve` with their own handler; the messages they
send back are cut to a few kilobytes (`message_tail`), and an expected error travels as its message,
anything else as its traceback (`error_text`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
import traceback
from collections.abc import Callable

from aotc.files import ScratchDir

__all__ = [
    "STARTUP_TIMEOUT",
    "RunnerProcess",
    "Worker",
    "WorkerStartError",
    "error_text",
    "message_tail",
    "serve",
    "shutdown_workers",
]

STARTUP_TIMEOUT = 120.0
_MSG_LIMIT = 4000


class Worker:
    """A child process that answers requests over a pipe; it can be killed and started again."""

    def __init__(self, ctx, name: str, main: Callable, args: tuple) -> None:
        self.ctx, self.name, self.main, self.args = ctx, name, main, args
        self.proc = None
        self.conn = None
        self.start()

    def start(self) -> None:
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=self.main, args=(child, *self.args), name=self.name, daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        self.ready = False
        self.task: int | None = None
        self.deadline = time.monotonic() + STARTUP_TIMEOUT
        self.done = 0

    def submit(self, task_id: int, payload, timeout: float) -> None:
        self.conn.send((task_id, payload))
        self.task = task_id
        self.deadline = time.monotonic() + timeout

    def receive(self) -> tuple[str, object]:
        """The next message: ("ready", None), ("failed", text) or ("result", (task_id, payload))."""
        kind, payload = self.conn.recv()
        if kind == "ready":
            self.ready = True
        elif kind == "result":
            self.task = None
            self.done += 1
        return kind, payload

    def death_reason(self) -> str:
        self.proc.join(timeout=2.0)
        code = self.proc.exitcode
        if code is None:
            return "its pipe closed"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5.0)
        self.conn.close()

    def restart(self) -> None:
        self.kill()
        self.start()

    def ask_to_stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)

    def stop(self) -> None:
        self.proc.join(timeout=1.0)
        self.kill()


class WorkerStartError(RuntimeError):
    """A worker process did not start; the message says why."""


class RunnerProcess:
    """The runner: a `Worker` running a `RunnerMain` that checks and times one built candidate at a time,
    restarted when it dies or passes the timeout. The measurer has one, and so has a cluster's device."""

    def __init__(self, worker: Worker, what: str = "the runner process") -> None:
        self.worker, self.what = worker, what

    def await_ready(self) -> None:
        """Wait for the runner's setup (it runs the reference first); WorkerStartError if it fails."""
        w = self.worker
        while not w.ready:
            if not w.conn.poll(max(0.0, w.deadline - time.monotonic())):
                w.kill()
                raise WorkerStartError(f"{self.what} did not start within {STARTUP_TIMEOUT:.0f} s")
            try:
                kind, payload = w.receive()
            except (EOFError, OSError):
                raise WorkerStartError(f"{self.what} died while starting ({w.death_reason()})") from None
            if kind == "failed":
                raise WorkerStartError(f"{self.what} failed to start:\n{payload}")

    def run(self, request: tuple, timeout: float) -> tuple:
        """The runner's answer to `request` (candidate path, cutoff, layouts); RUN_TIMEOUT or
        RUNTIME_DEVICE (restarting it) when it passes `timeout` or dies. WorkerStartError when a
        restarted runner cannot start."""
        from aotc.search.common import ErrorCode

        w = self.worker
        if not w.proc.is_alive():
            w.restart()
        self.await_ready()
        try:
            w.submit(0, request, timeout)
            if not w.conn.poll(timeout):
                w.restart()
                return ErrorCode.RUN_TIMEOUT, f"the kernel did not finish within {timeout:g} s", [], None
            _, (_, result) = w.receive()
        except (EOFError, OSError):
            reason = w.death_reason()
            w.restart()
            return ErrorCode.RUNTIME_DEVICE, f"{self.what} died while running the kernel ({reason})", [], None
        return result


def shutdown_workers(workers: list[Worker], workdir: ScratchDir) -> None:
    """Ask every worker to stop, kill those that do not, and delete their working directory."""
    for w in workers:
        w.ask_to_stop()
    for w in workers:
        w.stop()
    workdir.remove()


def die_with_parent() -> None:
    """In a worker process: no Ctrl-C (the parent handles it), and killed when the parent dies, even by
    SIGKILL or `os._exit`, where no exit handler stops the worker (Linux's PR_SET_PDEATHSIG)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def _child_setup(env: dict[str, str]) -> None:
    """Environment for a worker: variables (an empty one is removed), then `die_with_parent`."""
    for key, value in env.items():
        if value:
            os.environ[key] = value
        else:
            os.environ.pop(key, None)
    die_with_parent()


def serve(conn, env: dict[str, str], setup: Callable[[], Callable]) -> None:
    """Run `setup` to get a handler, report ready (or the failure), then answer requests until None."""
    _child_setup(env)
    try:
        handle = setup()
    except BaseException as err:  # an expected error says its message, a bug its traceback
        conn.send(("failed", error_text(err)))
        return
    conn.send(("ready", None))
    while (msg := conn.recv()) is not None:
        task_id, payload = msg
        conn.send(("result", (task_id, handle(payload))))


def message_tail(text: str) -> str:
    """`text` cut to its last few kilobytes (the end of a traceback says most)."""
    return text if len(text) <= _MSG_LIMIT else "..." + text[-_MSG_LIMIT:]


def error_text(err: BaseException) -> str:
    """The message of an expected error; the traceback of anything else, a bug (call inside `except`)."""
    if type(err).__module__.startswith("aotc.") or isinstance(
        err, ValueError | TypeError | KeyError | OSError
    ):
        return f"{type(err).__name__}: {err}"
    return message_tail(traceback.format_exc())
