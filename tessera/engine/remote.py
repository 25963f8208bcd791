"""The engine across hosts, through torchrun's rendezvous: rank 0 is the driver (scheduler, sampling, the
HTTP server of `tessera serve`), ranks 1..N are engine workers, each on its own host or not.

Start-up (``bootstrap``, every rank): torchrun's env:// rendezvous (``MASTER_ADDR``/``MASTER_PORT``, gloo)
joins all ranks once, long enough to exchange addresses: the driver's control address (a
``multiprocessing.connection`` listener on this host's address towards ``MASTER_ADDR``, or
``TESSERA_HOST_ADDR``) with a random key, and each worker's address. That group is then left; each worker
connects to the driver and says which rank it is.

Then the driver runs the ordinary engine (``serve-run``, ``generate``, ``serve``): with a link installed
(``install``), ``EngineCluster`` hands its worker specs to the connected workers instead of spawning
processes (``RemoteLink.spawn``). Each start names worker 0's address and a port it reported free as the
data plane's rendezvous (``MASTER_ADDR``/``MASTER_PORT`` of the workers' own env:// group, world N), so the
workers join a gloo group of their own (NCCL on CUDA) and pass activations to each other directly, as on
one host. Commands, results and heartbeats travel over each worker's connection (a heartbeat is stamped
with the driver's clock on arrival: hosts' clocks need not agree). A worker whose iteration fails exits,
and torchrun's agents stop every rank: a lost host ends the job (no recovery across hosts).

Network interfaces: gloo picks its interface by ``GLOO_SOCKET_IFNAME`` and NCCL by ``NCCL_SOCKET_IFNAME``
(both read by PyTorch in every rank); ``TESSERA_HOST_ADDR`` names the address this host is reached at when
the route towards ``MASTER_ADDR`` is not it.
"""

from __future__ import annotations

import os
import queue
import secrets
import socket
import threading
import time
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import torch.distributed as dist

from tessera.errors import UserError
from tessera.runtime.launch import RankEnv

_LINK: RemoteLink | None = None  # the driver's link to its workers, when this process is torchrun's rank 0


def install(link: RemoteLink | None) -> None:
    """Make ``link`` the way every EngineCluster of this process starts its workers (None: spawn)."""
    global _LINK
    _LINK = link


def installed() -> RemoteLink | None:
    return _LINK


def host_address(master: str) -> str:
    """This host's address as the others reach it: TESSERA_HOST_ADDR, else the local end of a route towards
    the rendezvous host (no packet is sent)."""
    if os.environ.get("TESSERA_HOST_ADDR"):
        return os.environ["TESSERA_HOST_ADDR"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(master), 9))
        return str(s.getsockname()[0])


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def engine_env() -> RankEnv:
    """What torchrun tells this process, for the engine: a driver (rank 0) and at least one worker rank."""
    try:
        env = RankEnv.from_env()
    except UserError:
        raise UserError("run under torchrun (RANK and WORLD_SIZE unset): torchrun --nnodes N ... -m "
                        "tessera.cli.torchrun VERB ...") from None
    if env.world < 2:
        raise UserError(f"WORLD_SIZE={env.world}: the driver (rank 0) needs at least one worker rank")
    return env


def bootstrap(env: RankEnv) -> tuple[Listener | None, list[Any]]:
    """Exchange addresses over torchrun's rendezvous (module docstring); the driver's listener (rank 0) and
    every rank's entry: rank 0 (address, key), a worker (its address, a free port)."""
    dist.init_process_group("gloo", init_method="env://", rank=env.rank, world_size=env.world)
    me = host_address(env.master)
    listener = None
    if env.rank == 0:
        key = secrets.token_bytes(16)
        listener = Listener((me, 0), authkey=key)
        mine: Any = (listener.address, key)
    else:
        mine = (me, free_port(me))
    infos: list[Any] = [None] * env.world
    dist.all_gather_object(infos, mine)
    dist.destroy_process_group()
    # every later group (the workers' own, or one a driver spawns on its host to profile) hosts its store
    # at its rank 0, not at torchrun's agent, whose store this exchange used
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    return listener, infos


class _Sender:
    """A connection's sending end shared by threads (results, heartbeats): one message at a time."""

    def __init__(self, conn: Connection) -> None:
        self.conn, self.lock = conn, threading.Lock()

    def put(self, msg: Any) -> None:
        with self.lock:
            self.conn.send(msg)

    def close(self) -> None:  # the worker's results queue: sends are synchronous, nothing to flush
        pass

    def join_thread(self) -> None:
        pass


class _Beat:
    """A worker's heartbeat slot (``_watch`` writes it every 0.1 s): each write is a message."""

    def __init__(self, sender: _Sender) -> None:
        self.sender = sender

    def __setitem__(self, rank: int, _value: float) -> None:
        self.sender.put(("beat", rank))


class _Commands:
    """A worker's command queue: the spec first, then what the driver sends, until its None."""

    def __init__(self, conn: Connection, spec: Any) -> None:
        self.conn, self.first = conn, [spec]

    def get(self) -> Any:
        return self.first.pop() if self.first else self.conn.recv()


def worker_loop(conn: Connection, target: Any) -> None:
    """A worker rank: each ("start", env, spec) runs ``target`` (the engine's worker_main) until the
    driver's None, then says ("bye", port) with a fresh free port for the next start; ("exit",) ends it."""
    sender = _Sender(conn)
    address = host_address(os.environ.get("MASTER_ADDR", "127.0.0.1"))
    while True:
        msg = conn.recv()
        if msg[0] == "exit":
            return
        _, data_env, spec = msg
        os.environ.update(data_env)
        target(spec.rank, _Commands(conn, spec), sender, _Beat(sender), os.getppid())
        sender.put(("bye", free_port(address)))


class _Remote:
    """A connected worker as Processes sees a process: alive until it says bye (idle again) or its
    connection ends (its process exited: torchrun then stops the job)."""

    def __init__(self, link: RemoteLink, index: int) -> None:
        self.link, self.index = link, index
        self.pid = None  # on another host: no /proc to read its state from
        self.exitcode: int | None = None
        self.done = threading.Event()

    def is_alive(self) -> bool:
        return not self.done.is_set()

    def join(self, timeout: float | None = None) -> None:
        self.done.wait(timeout)

    def terminate(self) -> None:  # a remote process cannot be signalled: its connection is closed instead
        if self.is_alive():
            self.link.conns[self.index].close()
            self.exitcode = -15
            self.done.set()

    kill = terminate


class _Queue:
    """The driver's ends of the queues Processes uses, over the connections."""

    def __init__(self, link: RemoteLink, index: int | None = None) -> None:
        self.link, self.index = link, index

    def put(self, msg: Any) -> None:
        self.link.conns[self.index].send(msg)

    def get(self, timeout: float | None = None) -> Any:
        return self.link.results.get(timeout=timeout)

    def get_nowait(self) -> Any:
        return self.link.results.get_nowait()

    def close(self) -> None:
        pass

    def cancel_join_thread(self) -> None:
        pass


class RemoteLink:
    """The driver's connections to its workers (torchrun ranks 1..N, in rank order) and their readers."""

    def __init__(self, conns: list[Connection], ports: list[int], addresses: list[str]) -> None:
        self.conns, self.ports, self.addresses = conns, ports, addresses
        self.results: queue.Queue = queue.Queue()
        self.beats: dict[int, float] = {}
        self.procs: list[_Remote] = []
        self.ranks: dict[int, int] = {}  # worker index -> its engine rank in the current start
        for i in range(len(conns)):
            threading.Thread(target=self._read, args=(i,), daemon=True, name=f"tessera-remote-{i}").start()

    @classmethod
    def accept(cls, listener: Listener, infos: list[Any]) -> RemoteLink:
        """Rank 0: wait for every worker to connect and say its rank."""
        workers = len(infos) - 1
        conns: list[Connection | None] = [None] * workers
        for _ in range(workers):
            c = listener.accept()
            kind, rank = c.recv()
            assert kind == "hello" and 1 <= rank <= workers and conns[rank - 1] is None, (kind, rank)
            conns[rank - 1] = c
        listener.close()
        return cls([c for c in conns if c is not None], [p for _, p in infos[1:]], [a for a, _ in infos[1:]])

    @property
    def workers(self) -> int:
        return len(self.conns)

    def _read(self, i: int) -> None:
        conn = self.conns[i]
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                proc = self._proc(i)
                if proc is not None and proc.is_alive():
                    proc.exitcode = 1
                    proc.done.set()
                return
            if msg[0] == "beat":
                self.beats[msg[1]] = time.monotonic()
            elif msg[0] == "bye":
                self.ports[i] = msg[1]
                proc = self._proc(i)
                if proc is not None:
                    proc.exitcode = 0
                    proc.done.set()
            else:
                self.results.put(msg)

    def _proc(self, i: int) -> _Remote | None:
        rank = self.ranks.get(i)
        return self.procs[rank] if rank is not None and rank < len(self.procs) else None

    def spawn(self, processes: Any, specs: list[Any]) -> None:
        """Start ``specs`` (engine ranks 0..n-1) on workers 0..n-1 of this link, as Processes.spawn would
        on this host: worker 0 hosts the data plane's rendezvous."""
        if any(p.is_alive() for p in self.procs):
            raise UserError("under torchrun the worker ranks run one placement at a time; --latency-placement "
                            "(two resident pools) needs a run on one host")
        if len(specs) > self.workers:
            raise UserError(f"{len(specs)} engine workers but torchrun started {self.workers} worker ranks; "
                            f"give --devices with {self.workers} entries (one per rank after the driver)")
        self.results = queue.Queue()
        self.beats = {}
        self.ranks = {i: i for i in range(len(specs))}
        self.procs = [_Remote(self, i) for i in range(len(specs))]
        data_env = {"MASTER_ADDR": self.addresses[0], "MASTER_PORT": str(self.ports[0])}
        processes.results = _Queue(self)
        processes.commands = [_Queue(self, i) for i in range(len(specs))]
        processes.heartbeat = _Beats(self)
        processes.spawned_at = time.monotonic()
        processes.procs = list(self.procs)
        for i, spec in enumerate(specs):
            self.conns[i].send(("start", data_env, spec))

    def close(self) -> None:
        """Tell every worker rank to exit (the end of the driver's command)."""
        for c in self.conns:
            try:
                c.send(("exit",))
            except OSError:
                pass


class _Beats:
    """The heartbeat array Processes reads: the driver's clock when each rank last beat (0: not yet)."""

    def __init__(self, link: RemoteLink) -> None:
        self.link = link

    def __getitem__(self, rank: int) -> float:
        return self.link.beats.get(rank, 0.0)


def connect(infos: list[Any], rank: int) -> Connection:
    """A worker rank: connect to the driver and say which rank it is."""
    address, key = infos[0]
    deadline = time.monotonic() + 60.0
    while True:
        try:
            conn = Client(address, authkey=key)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.send(("hello", rank))
    return conn
