"""The supervisor of a server with several front ends (``frontends`` > 1; ``core.frontends`` sizes them).

One process (``python -m core serve``, SageMaker's ``serve``) that loads no model:

1. starts the executors, when the server has them (``executors``: a callable that starts them and returns
   an object with ``address``, ``pids``, ``check()``, ``restart()`` and ``stop(timeout)``);
2. binds the port once (``host``/``port``, IPv4 or IPv6), before any model loads, and spawns N front-end
   processes (``subprocess``: a fresh interpreter each, never a fork of this one), each serving the app with
   uvicorn on a listening socket it inherits (:class:`Listeners`): on Linux one socket per front end, in a
   ``SO_REUSEPORT`` group, so that the kernel spreads the connections evenly over them; elsewhere one socket
   they share;
3. watches them: a front end that dies is started again (the others keep serving); a dead executor is
   restarted with ``restart()`` (meanwhile the front ends answer ``/ready`` 503), and when restarts keep
   failing, or a front end keeps failing to start, the server exits 1 with one log line saying why;
4. on SIGTERM / SIGINT: stops accepting, lets every front end drain its in-flight requests
   (``shutdown_grace_s``), then drains the executors, and exits 0.

A process that keeps its own main thread and signals (Modal's container, which also serves the executor from a
thread: ``core.executor.server.ThreadExecutor``) runs the same steps with :meth:`Supervisor.start_in_background`
and :meth:`Supervisor.stop` instead of ``run()``.

Every child is in this process's process group and is killed by the kernel when this process dies, even by
SIGKILL (``PR_SET_PDEATHSIG``, set by the child itself first thing: :func:`die_with_parent`).

The front end's own program is the caller's (``command``): it reads a JSON hand-off (:class:`Handoff`) on its
standard input, whose ``fd`` is the listening socket and ``ready_fd`` a pipe it writes one byte to once it
serves.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from core.errors import StartupFailed

log = logging.getLogger("tessera.supervisor")

PR_SET_PDEATHSIG = 1
#: a front end that exits within this many seconds of being ready counts as a failed start
FAILED_START_S = 10.0
#: failed starts in a row (of one front end, or executor restarts) before the server gives up
MAX_FAILED_STARTS = 3
#: how long the supervisor waits for a front end's first ready signal
FRONTEND_READY_TIMEOUT_S = 600.0


def die_with_parent(parent: int) -> None:
    """In a child: ask the kernel for SIGKILL when the parent dies (Linux ``PR_SET_PDEATHSIG``), then exit
    at once if the parent already died before the request (the child was then re-parented). No-op where
    prctl does not exist."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


def port_taken_message(host: str, port: int, exc: OSError) -> str:
    return (f"cannot listen on {host}:{port}: {exc.strerror or exc} (another server on that port? "
            "choose another with --port or TESSERA_PORT)")


def bind_listener(host: str, port: int, backlog: int = 2048, *, reuse_port: bool = False,
                  listen: bool = True) -> socket.socket:
    """A socket for the front ends: bound as uvicorn binds (``SO_REUSEADDR``; an IPv6 address, e.g. ``::``, as
    IPv6), inheritable, listening unless ``listen`` is False (a front end's server then listens on it once it
    serves); with ``reuse_port``, one of a ``SO_REUSEPORT`` group. Raises ``StartupFailed`` when the port is
    taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        if ":" not in host and not _is_ipv4(host):  # a host name: the first address it resolves to
            family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        else:
            address = (host, port)
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise StartupFailed(port_taken_message(host, port, exc)) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        if listen:
            sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise StartupFailed(port_taken_message(host, port, exc)) from None
    sock.set_inheritable(True)
    return sock


#: where the kernel spreads new connections evenly over the sockets of a ``SO_REUSEPORT`` group (Linux); elsewhere
#: a group does not balance, so the front ends share one socket
SPREADS_CONNECTIONS = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


class Listeners:
    """The front ends' listening sockets, one per front end in a ``SO_REUSEPORT`` group where the kernel spreads
    new connections evenly over such a group (``spread``: Linux), else one socket they all share.

    Why not one shared socket everywhere: the front end whose loop wakes first accepts every connection waiting
    on it, so clients that connect together (a pool opening its connections at start) land mostly on one front
    end (measured: 40 to 62 of 64 connections on one of two front ends, in seven starts), and the others sit
    nearly idle for as long as the connections live. In a group the kernel picks a socket per new connection
    by a hash of its addresses.

    The port is probed once, at once, without ``SO_REUSEPORT`` (a taken port, another server's group
    included, fails the start before any model loads: ``StartupFailed``), and the ``count`` sockets are bound
    at once, which holds it. A front end's socket is listened on by the front end itself, once it serves
    (uvicorn listens on the sockets it is given): only then does the kernel send it connections. Once handed
    to its front end (:meth:`handed`), the socket lives in that process alone, so it closes when the process
    exits, however it exits, and new connections go to the front ends still serving at once; a restart gets a
    new one. (A connection already waiting on it when it died is refused, as its open connections are.)"""

    def __init__(self, host: str, port: int, count: int, *, spread: bool = SPREADS_CONNECTIONS):
        first = bind_listener(host, port, listen=not spread)
        self.address = first.getsockname()[:2]  # numeric, with the port chosen when 0 was asked for
        self.shared: socket.socket | None = None if spread else first
        #: bound for a front end not yet spawned (the port stays held while the models load)
        self.unhanded: dict[int, socket.socket] = {}
        if spread:
            first.close()
            self.unhanded = {index: self._bind() for index in range(count)}

    def _bind(self) -> socket.socket:
        return bind_listener(self.address[0], self.address[1], reuse_port=True, listen=False)

    def socket_for(self, index: int) -> socket.socket:
        """The socket front end ``index`` is to inherit: the shared one, or one of its own."""
        if self.shared is not None:
            return self.shared
        return self.unhanded.pop(index, None) or self._bind()

    def handed(self, sock: socket.socket) -> None:
        """``sock`` was inherited by its front end (or the front end failed to spawn): this process's copy of a
        front end's own socket is closed; the shared one stays for the next."""
        if sock is not self.shared:
            sock.close()

    def close(self) -> None:
        """Every socket still here closed; the front ends' copies close as they stop, then the port refuses."""
        for sock in [*self.unhanded.values(), *([self.shared] if self.shared is not None else [])]:
            sock.close()
        self.unhanded.clear()
        self.shared = None


def _is_ipv4(host: str) -> bool:
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return True


@dataclass
class Handoff:
    """What a front end reads on its standard input (one JSON object): ``fd`` the listening socket,
    ``ready_fd`` the pipe to write one byte to once it serves, ``parent`` the supervisor's pid (for
    :func:`die_with_parent`), ``index`` its number, ``settings`` (``model_dump(mode="json")`` of the server's
    settings; secrets travel here, never in the environment or on the command line), ``plan`` (the
    ``core.frontends.FrontendPlan`` as a dict), ``executors`` (their ``address``: the run directory the
    front end's models connect through), ``extra`` (the surface's own), ``restart`` (None at the server's start;
    for a front end started again, why: ``front end 1 (pid N) exited with signal SIGKILL``)."""

    fd: int
    ready_fd: int
    parent: int
    index: int
    settings: dict
    plan: dict
    executors: str
    extra: dict = field(default_factory=dict)
    restart: str | None = None

    def dumps(self) -> bytes:
        return json.dumps(self.__dict__).encode()

    @classmethod
    def read(cls, stream) -> "Handoff":
        return cls(**json.loads(stream.read()))


def signal_ready(handoff: Handoff) -> None:
    """In a front end: tell the supervisor it serves (once)."""
    try:
        os.write(handoff.ready_fd, b"r")
        os.close(handoff.ready_fd)
    except OSError:
        pass


@dataclass
class _Frontend:
    index: int
    proc: subprocess.Popen
    ready_r: int
    started: float
    ready_at: float | None = None
    failed_starts: int = 0
    #: a front end started again: why (the one before it exited so), logged with the time it took once it serves
    restart: str | None = None


class Supervisor:
    """``run()`` serves until SIGTERM/SIGINT (returns 0) or until it gives up (returns 1).

    ``settings``: the server's Settings; ``plan``: its ``FrontendPlan``; ``command``: the front end's command
    line (it reads a :class:`Handoff` on stdin); ``executors``: a callable ``(settings) -> executor set`` (an
    ``ExecutorSet``, or a ``ThreadExecutor`` in this process) whose ``address`` the front ends connect to;
    ``extra``: put in every hand-off."""

    def __init__(self, settings, plan, command: list[str], *, executors: Callable[[Any], Any],
                 extra: dict | None = None, env: dict[str, str] | None = None):
        self.settings = settings
        self.plan = plan
        self.command = command
        self.start_executors = executors
        self.extra = extra or {}
        self.env = env
        self.executors = None
        self.frontends: dict[int, _Frontend] = {}
        self.listeners: Listeners | None = None
        self._stop = threading.Event()
        self._signal: int | None = None
        self._executor_failures = 0
        self._restarted_at = 0.0
        self._watcher: threading.Thread | None = None
        #: why the server stopped or failed to start (None while it serves); ``status``: the exit status once stopped
        self.failure: str | None = None
        self.status: int | None = None

    # ---- start ----------------------------------------------------------------------------------------

    def _spawn(self, index: int, failed_starts: int = 0, restart: str | None = None) -> _Frontend:
        assert self.listeners is not None
        listener = self.listeners.socket_for(index)
        ready_r, ready_w = os.pipe()
        handoff = Handoff(fd=listener.fileno(), ready_fd=ready_w, parent=os.getpid(), index=index,
                          settings=self.settings.model_dump(mode="json"), plan=self.plan.as_dict(),
                          executors=self.executors.address, extra=self.extra, restart=restart)
        try:
            # spawned from the main thread: PR_SET_PDEATHSIG fires when the thread that forked the child exits
            proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, pass_fds=(listener.fileno(), ready_w),
                                    env=self.env)
        finally:
            self.listeners.handed(listener)
            os.close(ready_w)
        assert proc.stdin is not None
        try:
            proc.stdin.write(handoff.dumps())
            proc.stdin.close()
        except BrokenPipeError:  # it died at once; the watch loop sees it
            pass
        log.info("front end %d started (pid %d)", index, proc.pid)
        return _Frontend(index, proc, ready_r, time.monotonic(), failed_starts=failed_starts, restart=restart)

    def _install_signals(self) -> Callable[[], None]:
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

        def handler(signum, frame):
            self._signal = signum
            self._stop.set()

        for s in previous:
            signal.signal(s, handler)

        def restore() -> None:
            for s, h in previous.items():
                signal.signal(s, h)

        return restore

    def run(self) -> int:
        restore = self._install_signals()
        try:
            status = self._start()
            return self._watch() if status is None else status
        finally:
            self._kill_all()
            restore()

    def _start(self) -> int | None:
        """Bind, start the executors, spawn the front ends and wait until each serves: None once they all do,
        else the exit status (the reason logged and kept in ``failure``)."""
        host, port = self.settings.host, int(self.settings.port)
        try:
            self.listeners = Listeners(host, port, self.plan.count)  # before minutes of loading, not after
        except StartupFailed as exc:
            log.error("%s", exc.message)
            self.failure = exc.message
            return 1
        try:
            self.executors = self.start_executors(self.settings)
        except StartupFailed as exc:
            log.error("executors failed to start: %s", exc.message)
            self.failure = f"executors failed to start: {exc.message}"
            return 1
        if self._stop.is_set():
            return self._drain()
        log.info("starting %d front ends on %s:%d (%s)", self.plan.count, host, port, self.plan.reason)
        for i in range(self.plan.count):
            self.frontends[i] = self._spawn(i)
        if not self._wait_first_ready():
            return self._drain() if self._stop.is_set() else self._give_up("a front end failed to start")
        log.info("serving on %s:%d with %d front ends (pids %s)%s", host, port, len(self.frontends),
                 " ".join(str(f.proc.pid) for f in self.frontends.values()),
                 f" and executors (pids {' '.join(map(str, self.executors.pids))})")
        return None

    # ---- in a host process that keeps its main thread (Modal's class) ------------------------------------

    def start_in_background(self) -> None:
        """``run()`` for a process that keeps its own main thread and signals (Modal's container): start from
        the calling thread (which must outlive the front ends: ``PR_SET_PDEATHSIG`` follows the thread that
        started a child), then watch from a thread of its own; :meth:`stop` drains. Raises ``StartupFailed``
        with the reason when the start fails (everything started is stopped first)."""
        try:
            status = self._start()
        except BaseException:
            self._kill_all()
            raise
        if status is not None:
            self._kill_all()
            raise StartupFailed(self.failure or "the front ends stopped while starting")
        self._watcher = threading.Thread(target=self._watch_in_background, name="tessera-supervisor", daemon=True)
        self._watcher.start()

    def _watch_in_background(self) -> None:
        try:
            self.status = self._watch()
        finally:
            self._kill_all()

    @property
    def serving(self) -> bool:
        """Started in the background and still watching (not stopped, not given up)."""
        return self._watcher is not None and self._watcher.is_alive()

    def stop(self) -> int | None:
        """Drain what :meth:`start_in_background` started (the front ends within ``shutdown_grace_s``, then the
        executors) and wait for it; the status (0 after a drain, 1 when it had given up), None if never started."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()
        return self.status

    def _wait_first_ready(self) -> bool:
        """Every front end ready (True), or one exited first / a stop signal came (False)."""
        deadline = time.monotonic() + FRONTEND_READY_TIMEOUT_S
        while not self._stop.is_set() and time.monotonic() < deadline:
            self._read_ready(0.2)
            for f in self.frontends.values():
                if f.ready_at is None and (f.ready_r < 0 or f.proc.poll() is not None):
                    try:
                        f.proc.wait(30)  # it closed the pipe without a word: it is exiting
                    except subprocess.TimeoutExpired:
                        f.proc.kill()
                        f.proc.wait()
                    log.error("front end %d (pid %d) exited with %s before it served", f.index, f.proc.pid,
                              _exit_text(f.proc.returncode))
                    return False
            if all(f.ready_at is not None for f in self.frontends.values()):
                return True
        return False

    def _read_ready(self, timeout: float) -> None:
        waiting = {f.ready_r: f for f in self.frontends.values() if f.ready_at is None}
        if not waiting:
            self._stop.wait(timeout)
            return
        try:
            readable, _, _ = select.select(list(waiting), [], [], timeout)
        except InterruptedError:
            return
        for fd in readable:
            f = waiting[fd]
            said = os.read(fd, 1)  # a byte: ready; b"": it closed the pipe (it exits) without saying so
            os.close(fd)
            f.ready_r = -1
            if said:
                f.ready_at = time.monotonic()
                log.info("front end %d (pid %d) serving%s", f.index, f.proc.pid,
                         f", {f.ready_at - f.started:.1f} s after it was started again ({f.restart})"
                         if f.restart else "")

    # ---- watch ----------------------------------------------------------------------------------------

    def _watch(self) -> int:
        while not self._stop.is_set():
            self._read_ready(0.2)
            for f in list(self.frontends.values()):
                code = f.proc.poll()
                if code is None or self._stop.is_set():
                    continue
                failed = f.ready_at is None or time.monotonic() - f.ready_at < FAILED_START_S
                failures = f.failed_starts + 1 if failed else 0
                if failures >= MAX_FAILED_STARTS:
                    return self._give_up(f"front end {f.index} exited {failures} times in a row soon after "
                                         f"starting (last: {_exit_text(code)})")
                why = f"front end {f.index} (pid {f.proc.pid}) exited with {_exit_text(code)}"
                log.warning("%s; starting it again (the others keep serving)", why)
                if f.ready_r >= 0:
                    os.close(f.ready_r)
                try:
                    self.frontends[f.index] = self._spawn(f.index, failures, restart=why)
                except StartupFailed as exc:  # a socket of its own could not be bound again
                    return self._give_up(f"front end {f.index} could not be started again: {exc.message}")
            if self.executors is not None and not self._stop.is_set():
                problem = self.executors.check()
                if problem is not None and not self._restart_executors(problem):
                    return self._give_up(f"executors could not be restarted ({problem})")
                if problem is None and time.monotonic() - self._restarted_at > FAILED_START_S:
                    self._executor_failures = 0  # up for a while: the next death starts a new count
        return self._drain()

    def _restart_executors(self, problem: str) -> bool:
        """Restart the dead executors; False once restarts failed ``MAX_FAILED_STARTS`` times in a row (an
        executor that dies again within ``FAILED_START_S`` of its restart counts as one more)."""
        log.error("%s; restarting it (the front ends answer /ready 503 meanwhile)", problem)
        while not self._stop.is_set():
            if self._executor_failures >= MAX_FAILED_STARTS:
                return False
            try:
                names = self.executors.restart()
            except StartupFailed as exc:
                self._executor_failures += 1
                log.error("executor restart %d of %d failed: %s", self._executor_failures, MAX_FAILED_STARTS,
                          exc.message)
                continue
            self._restarted_at = time.monotonic()
            if names:
                log.info("executors restarted: %s", ", ".join(names))
            return True
        return True

    # ---- stop -----------------------------------------------------------------------------------------

    def _give_up(self, why: str) -> int:
        log.error("tessera: stopping the server: %s", why)
        self.failure = why
        self._drain(quiet=True)
        return 1

    def _drain(self, quiet: bool = False) -> int:
        """Stop accepting, SIGTERM every front end (each drains within ``shutdown_grace_s``), then drain the
        executors in what is left of the grace; front ends still there after it (and a margin) are killed."""
        grace = float(self.settings.shutdown_grace_s)
        started = time.monotonic()
        if not quiet:
            name = signal.Signals(self._signal).name if self._signal else "stop"
            log.info("%s: draining %d front ends (grace %.0f s)%s", name,
                     sum(1 for f in self.frontends.values() if f.proc.poll() is None), grace,
                     ", then the executors" if self.executors is not None else "")
        if self.listeners is not None:
            self.listeners.close()  # the front ends' copies close as they stop: then the port refuses
            self.listeners = None
        for f in self.frontends.values():
            if f.proc.poll() is None:
                f.proc.send_signal(signal.SIGTERM)
        deadline = started + grace + 10.0  # uvicorn's own grace, then the app's shutdown
        for f in self.frontends.values():
            try:
                f.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("front end %d (pid %d) still running after the grace; killing it", f.index, f.proc.pid)
                f.proc.kill()
                f.proc.wait()
        if self.executors is not None:
            self.executors.stop(max(1.0, started + grace - time.monotonic()))
            self.executors = None
        if not quiet:
            log.info("stopped: every front end and executor exited")
        return 0

    def _kill_all(self) -> None:
        """Whatever is still running when run() leaves (an exception): killed, waited for."""
        for f in self.frontends.values():
            if f.proc.poll() is None:
                f.proc.kill()
                f.proc.wait()
        if self.executors is not None:
            self.executors.stop(0.0)
            self.executors = None
        if self.listeners is not None:
            self.listeners.close()
            self.listeners = None


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no status"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"
