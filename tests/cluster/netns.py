"""Network namespaces joined by a bridge, so several "machines" can run on one host (needs root).

    with NetnsLab() as lab:
        nodes = lab.cluster(3)          # bridge namespace + 3 node namespaces on 10.213.X.0/24
        process = nodes[0].run([sys.executable, "-c", "..."], stdout=subprocess.PIPE)
        nodes[1].link_down()            # a fault: the node drops off the bridge

Every name starts with `exotui-<pid>-`, so parallel runs never collide and the leftovers of a
crashed run (its pid dead) are swept by the next one. Closing the lab kills every process in its
namespaces and deletes them, whatever happened before.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

PREFIX = "exotui-"
NODE_DEVICE = "eth0"
_labs = itertools.count()


class NetnsUnavailable(RuntimeError):
    """This machine cannot make network namespaces (not root, no `ip`, no permission)."""


def netns_unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if check and result.returncode != 0:
        raise subprocess.CalledProcessError(
            result.returncode, result.args, result.stdout, result.stderr
        )
    return result


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    # `ip netns list` prints "name (id: N)" once a namespace has an id.
    names = [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.strip()]
    return [name for name in names if name.startswith(prefix)]


def namespace_pids(name: str) -> list[int]:
    result = ip("netns", "pids", name, check=False)
    return [int(pid) for pid in result.stdout.split()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill(pid: int, *, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)


def delete_namespace(name: str) -> None:
    """Kill whatever still runs inside, then delete it."""
    deadline = time.monotonic() + 5
    while (pids := namespace_pids(name)) and time.monotonic() < deadline:
        for pid in pids:
            _kill(pid)
        time.sleep(0.02)
    ip("netns", "delete", name, check=False)


def sweep_leftovers(prefix: str = PREFIX) -> list[str]:
    """Delete namespaces left by earlier runs whose process is gone; returns their names."""
    swept: list[str] = []
    for name in list_namespaces(prefix):
        owner = name[len(prefix) :].split("-", 1)[0]
        if owner.isdigit() and not _pid_alive(int(owner)):
            delete_namespace(name)
            swept.append(name)
    return swept


@dataclass
class NetnsNode:
    """One node namespace, with a veth into the bridge namespace."""

    name: str
    address: str
    device: str = NODE_DEVICE
    processes: list[subprocess.Popen[Any]] = field(default_factory=lambda: [])

    def run(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start argv inside this namespace; it is killed when the lab closes.

        It gets a session of its own, so the whole process group can be killed.
        """
        popen_kwargs.setdefault("start_new_session", True)
        process = subprocess.Popen(["ip", "netns", "exec", self.name, *argv], **popen_kwargs)
        self.processes.append(process)
        return process

    def link_down(self) -> None:
        ip("-n", self.name, "link", "set", self.device, "down")

    def link_up(self) -> None:
        ip("-n", self.name, "link", "set", self.device, "up")
        self.route_multicast()  # the kernel dropped it with the link

    def route_multicast(self) -> None:
        # There is no default route in here; multicast sent without a chosen interface must
        # still find its way out (zeroconf picks one, other senders may not).
        ip("-n", self.name, "route", "replace", "224.0.0.0/4", "dev", self.device)


class NetnsLab:
    """Owns the namespaces it creates and every process started in them."""

    def __init__(self) -> None:
        self.prefix = f"{PREFIX}{os.getpid()}-{next(_labs)}-"
        self.namespaces: list[str] = []  # creation order; deleted in reverse
        self.nodes: list[NetnsNode] = []
        self._clusters = itertools.count()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def cluster(self, count: int) -> list[NetnsNode]:
        """`count` node namespaces on one bridge, at 10.213.<octet>.1 .. count, /24."""
        index = next(self._clusters)
        octet = (os.getpid() + index) % 250 + 1  # distinct subnets, so a mix-up is visible
        bridge = self._add_namespace(f"c{index}-br")
        # Snooping off: link-local multicast (mDNS) must reach every port, querier or not.
        ip("-n", bridge, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
        ip("-n", bridge, "link", "set", "br0", "up")
        nodes: list[NetnsNode] = []
        for i in range(1, count + 1):
            name = self._add_namespace(f"c{index}-n{i}")
            port = f"v{i}"
            veth = ["type", "veth", "peer", "name", port, "netns", bridge]
            ip("-n", name, "link", "add", NODE_DEVICE, *veth)
            ip("-n", bridge, "link", "set", port, "master", "br0", "up")
            address = f"10.213.{octet}.{i}"
            ip("-n", name, "addr", "add", f"{address}/24", "dev", NODE_DEVICE)
            ip("-n", name, "link", "set", NODE_DEVICE, "multicast", "on", "up")
            ip("-n", name, "link", "set", "lo", "up")
            node = NetnsNode(name=name, address=address)
            node.route_multicast()
            nodes.append(node)
        self.nodes.extend(nodes)
        return nodes

    def close(self) -> None:
        processes = [process for node in self.nodes for process in node.processes]
        for process in processes:
            if process.poll() is None:
                _kill(process.pid, group=True)
        for name in reversed(self.namespaces):
            delete_namespace(name)
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        self.namespaces.clear()

    def _add_namespace(self, suffix: str) -> str:
        name = self.prefix + suffix
        result = ip("netns", "add", name, check=False)
        if result.returncode != 0:
            raise NetnsUnavailable(f"ip netns add {name}: {result.stderr.strip()}")
        self.namespaces.append(name)
        return name
