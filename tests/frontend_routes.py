"""For the tests of --frontend-processes: servers started with N front-end processes, and
stock tritonclient clients each on one connection whose accepting process is known.

A server with N >= 2 logs each front-end process it starts as
"Started front-end process <i> (pid <PID>)". The kernel hands each new connection to one of
them; `routes` opens clients until every process holds some, and learns which process holds
each client's connection from /proc (connection_owners.py), so a test can send one request
through one process and the next through another, and knows it did.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import wait_for
from connection_owners import own_client_ports, owner_of
from mini_triton.server import Settings
from serverproc import ServerProcess


def frontend_processes_built() -> bool:
    """Whether the server has front-end processes: the flag's setting and the process each
    front end runs in (`python -m mini_triton.frontend_processes.child`)."""
    try:
        child = importlib.util.find_spec("mini_triton.frontend_processes.child")
    except ImportError:
        return False
    return child is not None and "frontend_processes" in Settings.__dataclass_fields__


needs_frontend_processes = pytest.mark.skipif(
    not frontend_processes_built(), reason="--frontend-processes is not built yet")

STARTED_FRONTEND = re.compile(r"Started front-end process (\d+) \(pid (\d+)\)")
MOST_ROUTES = 32  # connections opened at most while waiting for every process to hold some

# A gRPC channel of its own: by default gRPC shares one connection among all channels of the
# same target and arguments in a process, which would put every client on one process.
OWN_GRPC_CONNECTION = [("grpc.use_local_subchannel_pool", 1),
                       ("grpc.max_send_message_length", -1),
                       ("grpc.max_receive_message_length", -1)]


def start_server(repository: Path, *flags: str, processes: int | str = 2,
                 expected: int = 2, services: tuple[str, ...] = ("http", "grpc")
                 ) -> ServerProcess:
    """A started server on `repository` with `--frontend-processes=processes`, once the log
    has named the `expected` front-end processes. The caller stops it."""
    server = ServerProcess(["--model-repository", str(repository),
                            f"--frontend-processes={processes}", *flags], services=services)
    server.start()
    if not wait_for(lambda: len(frontend_pids(server)) == expected, timeout=30):
        server.stop()
        raise AssertionError(f"the log names {frontend_pids(server)}, not {expected} "
                             f"front-end processes:\n{server.output}")
    return server


@contextmanager
def served(repository: Path, *flags: str, **options) -> Iterator[ServerProcess]:
    """`start_server` as a context: the server is stopped (SIGTERM) when it ends."""
    server = start_server(repository, *flags, **options)
    try:
        yield server
    finally:
        server.stop()


def frontend_pids(server: ServerProcess) -> dict[int, int]:
    """Front-end process index -> the PID of its latest start, as the server logged them."""
    pids = {}
    for line in list(server.lines):
        match = STARTED_FRONTEND.search(line)
        if match:
            pids[int(match.group(1))] = int(match.group(2))
    return pids


def new_client(protocol: str, url: str):
    if protocol == "http":  # one kept-alive connection; a process that hangs fails in 30 s
        return httpclient.InferenceServerClient(url, network_timeout=30.0)
    return grpcclient.InferenceServerClient(url, channel_args=OWN_GRPC_CONNECTION)


class Route:
    """A stock tritonclient client on one connection of its own, and `pid`, the front-end
    process holding that connection. The client lives on a thread of its own (the HTTP
    client's gevent sockets must stay on the thread that made them), so that requests sent
    through several routes are in flight together."""

    def __init__(self, protocol: str, server_port: int):
        self.protocol = protocol
        self.module = httpclient if protocol == "http" else grpcclient
        self.server_port = server_port
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"route-{protocol}")
        self.client = self._thread.submit(new_client, protocol,
                                          f"127.0.0.1:{server_port}").result(30)
        self.client_port = 0
        self.pid: int | None = None

    def submit(self, action, *args) -> Future:
        """Runs `action(route, *args)` on the route's thread."""
        return self._thread.submit(action, self, *args)

    def call(self, action, *args, timeout: float = 60):
        return self.submit(action, *args).result(timeout)

    def still_on_its_connection(self) -> bool:
        """Whether the connection the route opened is still open and held by `pid`: then
        every request it sent went through that process."""
        return self.client_port in own_client_ports(self.server_port) and \
            owner_of(self.server_port, self.client_port, [self.pid]) == self.pid

    def close(self) -> None:
        self._thread.submit(self.client.close).result(30)
        self._thread.shutdown()

    def __repr__(self) -> str:
        return f"Route({self.protocol}, port {self.client_port}, pid {self.pid})"


def open_route(server: ServerProcess, protocol: str, pids: list[int]) -> Route:
    """A route whose connection is open (one health request answered) and whose owner is
    known: the one connection to the port that this process gained meanwhile."""
    port = server.ports[protocol]
    before = own_client_ports(port)
    route = Route(protocol, port)
    assert route.call(lambda r: r.client.is_server_live())
    opened = own_client_ports(port) - before
    assert len(opened) == 1, f"{protocol} client opened connections {opened}, not one"
    route.client_port = opened.pop()
    route.pid = owner_of(port, route.client_port, pids)
    if route.pid is None:
        route.close()
        raise AssertionError(f"{protocol} connection from port {route.client_port} is held by "
                             f"none of the front-end processes {pids}")
    return route


@pytest.fixture
def routes():
    """`routes(server, protocol, per_process=1)`: routes grouped by the PID holding them,
    opened until each front-end process holds `per_process` of them. Fails when
    MOST_ROUTES connections did not reach every process. Closed after the test."""
    opened: list[Route] = []

    def open_routes(server: ServerProcess, protocol: str, per_process: int = 1,
                    pids: list[int] | None = None) -> dict[int, list[Route]]:
        pids = list(frontend_pids(server).values()) if pids is None else pids
        by_pid: dict[int, list[Route]] = {pid: [] for pid in pids}
        for _ in range(MOST_ROUTES):
            if all(len(group) >= per_process for group in by_pid.values()):
                return by_pid
            route = open_route(server, protocol, pids)
            opened.append(route)
            if len(by_pid[route.pid]) < per_process:
                by_pid[route.pid].append(route)
        if any(len(group) < per_process for group in by_pid.values()):
            raise AssertionError(f"{MOST_ROUTES} {protocol} connections did not give each "
                                 f"process {per_process}: {by_pid}")
        return by_pid

    yield open_routes
    for route in opened:
        route.close()


def one_route_on_each(by_pid: dict[int, list[Route]]) -> list[Route]:
    """The first route of each process: routes known to reach different processes."""
    return [group[0] for group in by_pid.values()]


def assert_connections_kept(used: list[Route]) -> None:
    """Every route still sits on the connection it opened, held by the same process: so the
    requests went through the processes the test meant (no reconnect moved one)."""
    moved = [route for route in used if not route.still_on_its_connection()]
    assert not moved, f"these routes lost the connection the test relied on: {moved}"


def plain_clients_on_each(server: ServerProcess, service: str, probe: str
                          ) -> dict[int, httpx.Client]:
    """One httpx client (one kept-alive connection) to `service`'s port per front-end
    process, for the routes tritonclient does not speak (SageMaker, Vertex AI); `probe` is
    the path each first GETs. The caller closes them."""
    pids = list(frontend_pids(server).values())
    port = server.ports[service]
    chosen: dict[int, httpx.Client] = {}
    for _ in range(MOST_ROUTES):
        if len(chosen) == len(pids):
            return chosen
        before = own_client_ports(port)
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                              limits=httpx.Limits(max_connections=1))
        assert client.get(probe).status_code == 200
        (client_port,) = own_client_ports(port) - before
        pid = owner_of(port, client_port, pids)
        if pid in chosen or pid is None:
            client.close()  # a process already chosen (None: none of them holds it)
        else:
            chosen[pid] = client
    for client in chosen.values():
        client.close()
    raise AssertionError(f"{MOST_ROUTES} {service} connections did not reach every "
                         f"process {pids}: {list(chosen)}")
