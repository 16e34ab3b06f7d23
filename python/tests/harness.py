"""Multi-process test harness: real processes, real shared memory and sockets.

:class:`Ranks` starts ``n`` worker processes (see :func:`_start_context`) that each join one tutti communicator
(and, on first use, a torch.distributed process group with backend "tutti") and then run
test functions on request, so that many small tests share one start-up. A test function
is a module-level ``fn(ctx, *args)``; :meth:`Ranks.run` calls it on every rank and returns
the per-rank results, or raises :class:`RankFailed` with every failing rank's traceback.
A rank that does not answer within the timeout fails the test and the group is restarted;
the failure carries every live rank's stacks (:func:`hang_report`), Python's and, where
``gdb`` is installed, the native threads'.

:func:`spawn` runs a function once in ``n`` fresh processes, for tests that break their
communicator on purpose (killed ranks, mismatches, timeouts).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankFailed(AssertionError):
    pass


def _stack_file(pid: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"tutti-harness-stacks-{pid}.txt")


_STACK_OUT = None


def _arm_stack_dump() -> None:
    """In a worker: SIGUSR1 writes every thread's Python stack to this process's stack file
    (faulthandler does it from the signal handler, so also while the thread is in Rust).
    The file goes when the worker returns (:func:`_disarm_stack_dump`) or when the parent
    has joined or killed it (:func:`_forget_stack_file`)."""
    import faulthandler

    global _STACK_OUT
    _STACK_OUT = open(_stack_file(os.getpid()), "w")
    faulthandler.register(signal.SIGUSR1, file=_STACK_OUT, all_threads=True)


def _disarm_stack_dump() -> None:
    import faulthandler

    faulthandler.unregister(signal.SIGUSR1)
    _forget_stack_file(os.getpid())


def _forget_stack_file(pid: Optional[int]) -> None:
    try:
        os.unlink(_stack_file(pid))
    except (OSError, TypeError):
        pass


def hang_report(procs: List[Any]) -> str:
    """Every live worker's stacks: Python's (SIGUSR1, see :func:`_arm_stack_dump`) and, where
    gdb is installed, each native thread's innermost 12 frames. So a hang in CI says where."""
    live = [(r, p) for r, p in enumerate(procs) if p is not None and p.is_alive()]
    for _, p in live:
        try:
            os.kill(p.pid, signal.SIGUSR1)
        except OSError:
            pass
    time.sleep(1.0)
    out = []
    for r, p in live:
        out.append(f"--- rank {r} (pid {p.pid}), Python stacks ---")
        try:
            with open(_stack_file(p.pid)) as f:
                out.append(f.read().strip() or "(none written)")
        except OSError as e:
            out.append(f"(none: {e})")
        if shutil.which("gdb"):
            try:
                g = subprocess.run(["timeout", "20", "gdb", "-p", str(p.pid), "-batch", "-ex", "thread apply all bt"],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   text=True, timeout=30)
                lines, depth = [], 0
                for ln in g.stdout.splitlines():
                    if ln.startswith("Thread"):
                        depth = 0
                        lines.append(ln)
                    elif ln.startswith("#") and depth < 12:
                        depth += 1
                        lines.append("    " + ln.split(" at /rustc/")[0])
                out.append(f"--- rank {r}, native stacks ---\n" + "\n".join(lines))
            except (OSError, subprocess.SubprocessError) as e:
                out.append(f"(gdb failed: {e})")
    return "\n".join(out)


class Ctx:
    """What a test function gets on each rank."""

    def __init__(self, rank: int, n: int, port: int, torch_port: int, timeout: float):
        self.rank, self.n = rank, n
        self.port, self.torch_port, self.timeout = port, torch_port, timeout
        self._comm = None
        self._dist = None
        self.scratch: dict = {}

    @property
    def comm(self):
        """The numpy-API communicator of this rank (created on first use)."""
        if self._comm is None:
            import tutti

            uid = tutti.UniqueId.for_address("127.0.0.1", self.port)
            self._comm = tutti.Communicator.init_rank(uid, self.n, self.rank, timeout=self.timeout)
        return self._comm

    def dist(self):
        """torch.distributed, initialised with backend "tutti" (on first use)."""
        if self._dist is None:
            import datetime

            import torch
            import torch.distributed as dist

            import tutti.torch  # noqa: F401

            torch.set_num_threads(1)
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(self.torch_port)
            dist.init_process_group("tutti", rank=self.rank, world_size=self.n,
                                    timeout=datetime.timedelta(seconds=self.timeout))
            self._dist = dist
        return self._dist


def _start_context() -> Any:
    """How worker processes start: from a fork server that has imported torch and numpy
    (``forkserver``; a rank then starts in about 0.1 s instead of 2-5 s of imports on 2
    cores), or, with ``TUTTI_TEST_START=spawn``, as fresh interpreters. Either way a rank
    is a new process, not a fork of pytest (which may have threads); it takes pytest's
    environment as it is at ``start()`` (:func:`_adopt_env`), as a spawned one would."""
    if os.environ.get("TUTTI_TEST_START", "forkserver") == "spawn":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["numpy", "torch"])  # a module that does not import is skipped
    return ctx


def _adopt_env(env: dict) -> None:
    """In a worker: the parent's environment at start (the fork server's is older)."""
    if os.environ != env:
        os.environ.clear()
        os.environ.update(env)


def _worker(rank: int, n: int, port: int, torch_port: int, timeout: float, inq: Any, outq: Any,
            env: dict) -> None:
    _adopt_env(env)
    sys.path.insert(0, HERE)
    _arm_stack_dump()
    ctx = Ctx(rank, n, port, torch_port, timeout)
    while True:
        job = inq.get()
        if job is None:
            break
        fn, args = job
        try:
            outq.put((rank, True, fn(ctx, *args)))
        except BaseException:  # noqa: BLE001 - reported to the parent
            outq.put((rank, False, traceback.format_exc()))
    try:
        if ctx._dist is not None:
            ctx._dist.destroy_process_group()
        if ctx._comm is not None:
            ctx._comm.destroy()
    except Exception:
        pass
    _disarm_stack_dump()


class Ranks:
    """``n`` long-lived worker processes; see the module doc."""

    def __init__(self, n: int, timeout: float = 60.0, env: Optional[dict] = None):
        self.n, self.timeout = n, timeout
        self._env = env or {}
        self._procs: List[Any] = []
        self._start()

    def _start(self) -> None:
        ctx = _start_context()
        port, tport = free_port(), free_port()
        self._inqs = [ctx.Queue() for _ in range(self.n)]
        self._outq = ctx.Queue()
        old = {k: os.environ.get(k) for k in self._env}
        os.environ.update(self._env)
        try:
            env = dict(os.environ)
            self._procs = [ctx.Process(target=_worker, args=(r, self.n, port, tport, self.timeout, self._inqs[r],
                                                              self._outq, env), daemon=True) for r in range(self.n)]
            for p in self._procs:
                p.start()
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def run(self, fn: Callable[..., Any], *args: Any, timeout: Optional[float] = None) -> list:
        """Runs ``fn(ctx, *args)`` on every rank; returns the results by rank."""
        for q in self._inqs:
            q.put((fn, args))
        results: List[Any] = [None] * self.n
        errors = {}
        limit = (timeout or self.timeout) + 30
        for _ in range(self.n):
            try:
                r, ok, val = self._outq.get(timeout=limit)
            except queue.Empty:
                answered = sorted({i for i, x in enumerate(results) if x is not None} | set(errors))
                report = hang_report(self._procs)
                self.restart()
                raise RankFailed(f"{fn.__name__}: no answer from some rank within {limit:.0f} s (hang?); "
                                 f"answered: {answered}\n{report}")
            if ok:
                results[r] = val
            else:
                errors[r] = val
        if errors:
            msg = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(errors.items()))
            raise RankFailed(f"{fn.__name__} failed on rank(s) {sorted(errors)}:\n{msg}")
        return results

    def restart(self) -> None:
        self.close(kill=True)
        self._start()

    def close(self, kill: bool = False) -> None:
        for p, q in zip(self._procs, self._inqs):
            if not kill:
                try:
                    q.put(None)
                except Exception:
                    pass
        for p in self._procs:
            p.join(timeout=0 if kill else 20)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
            _forget_stack_file(p.pid)
        self._procs = []


def _spawned(rank: int, n: int, port: int, fn: Callable[..., Any], args: tuple, outq: Any, env: dict) -> None:
    _adopt_env(env)
    sys.path.insert(0, HERE)
    _arm_stack_dump()
    try:
        outq.put((rank, True, fn(rank, n, port, *args)))
    except BaseException:  # noqa: BLE001
        outq.put((rank, False, traceback.format_exc()))
    _disarm_stack_dump()


def spawn(n: int, fn: Callable[..., Any], *args: Any, timeout: float = 120.0, env: Optional[dict] = None) -> list:
    """Runs ``fn(rank, n, port, *args)`` in ``n`` fresh processes; returns
    ``[(ok, result_or_traceback) or None if the rank died without answering]`` by rank.
    Raises RankFailed if the ranks are still running after ``timeout`` seconds."""
    ctx = _start_context()
    outq = ctx.Queue()
    port = free_port()
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        env_now = dict(os.environ)
        procs = [ctx.Process(target=_spawned, args=(r, n, port, fn, args, outq, env_now), daemon=True)
                 for r in range(n)]
        for p in procs:
            p.start()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out: List[Any] = [None] * n
    deadline = time.monotonic() + timeout
    got = 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            r, ok, val = outq.get(timeout=min(left, 1.0))
        except queue.Empty:
            # Poll every process: is_alive() reaps the dead, as a launcher would (a zombie
            # still has its pid, so its peers could not tell it is gone).
            alive = [p.is_alive() for p in procs]
            if not any(alive):
                # everybody exited; drain what is left
                try:
                    while True:
                        r, ok, val = outq.get(timeout=0.5)
                        out[r] = (ok, val)
                        got += 1
                except queue.Empty:
                    break
            continue
        out[r] = (ok, val)
        got += 1
    hung = [i for i, p in enumerate(procs) if p.is_alive() and out[i] is None]
    report = hang_report([p if i in hung else None for i, p in enumerate(procs)]) if hung else ""
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
        _forget_stack_file(p.pid)
    if hung:
        raise RankFailed(f"{fn.__name__}: rank(s) {hung} still running after {timeout:.0f} s (hang)\n{report}")
    return out


def check_all(results: list, name: str = "") -> list:
    """The results of a :func:`spawn`, raising if any rank failed or died."""
    bad = {i: r for i, r in enumerate(results) if r is None or not r[0]}
    if bad:
        msg = "\n".join(f"--- rank {i} ---\n{'died without answering' if r is None else r[1]}" for i, r in bad.items())
        raise RankFailed(f"{name} failed on rank(s) {sorted(bad)}:\n{msg}")
    return [r[1] for r in results]
