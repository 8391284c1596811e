"""The namespace lab behind the netns_cluster fixture leaves nothing behind (root only)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.conftest import NetnsCluster
from tests.cluster.netns import (
    PREFIX,
    NetnsLab,
    list_namespaces,
    netns_unavailable,
    sweep_leftovers,
)


@pytest.fixture
def need_netns() -> None:
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def escaped_sleeper(node_run: subprocess.Popen[str]) -> int:
    """The pid of a sleep that left the process group of the process that started it."""
    assert node_run.stdout is not None
    return int(node_run.stdout.readline())


SPAWN_ESCAPED_SLEEP = "setsid sleep 60 >/dev/null 2>&1 & echo $!; exec sleep 60"


def test_the_lab_kills_everything_and_deletes_its_namespaces_when_a_test_fails(
    need_netns: None,
) -> None:
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="the test failed"), NetnsLab() as lab:
        first, second = lab.cluster(2)
        started = first.run(["sleep", "60"])
        spawner = second.run(["sh", "-c", SPAWN_ESCAPED_SLEEP], stdout=subprocess.PIPE, text=True)
        pids += [started.pid, spawner.pid, escaped_sleeper(spawner)]
        assert all(alive(pid) for pid in pids)
        assert len(list_namespaces(lab.prefix)) == 3  # the bridge and two nodes
        raise RuntimeError("the test failed")
    assert list_namespaces(lab.prefix) == []
    assert [pid for pid in pids if alive(pid)] == []


def test_nodes_reach_each_other_and_a_link_can_go_down(netns_cluster: NetnsCluster) -> None:
    first, second = netns_cluster(2)
    assert first.address.rsplit(".", 1)[0] == second.address.rsplit(".", 1)[0]
    probe = f"import socket; socket.create_connection(('{second.address}', 9), timeout=1)"

    def connect() -> str:
        # Nothing listens on port 9: "refused" proves the peer answered, a timeout that it did not.
        process = first.run([sys.executable, "-c", probe], stderr=subprocess.PIPE, text=True)
        return process.communicate(timeout=5)[1]

    assert "ConnectionRefusedError" in connect()
    second.link_down()
    assert "TimeoutError" in connect()
    second.link_up()
    assert "ConnectionRefusedError" in connect()
    routes = subprocess.run(["ip", "-n", second.name, "route"], capture_output=True, text=True)
    assert "224.0.0.0/4" in routes.stdout  # multicast still has its way out


def test_leftovers_of_a_dead_run_are_swept(need_netns: None) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = f"{PREFIX}{dead.pid}-0-c0-n1"
    subprocess.run(["ip", "netns", "add", leftover], check=True)
    orphan = subprocess.Popen(
        ["ip", "netns", "exec", leftover, "sh", "-c", "echo inside; exec sleep 60"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # Sweep only once the orphan is inside: before that, no sweep could have seen it.
        assert orphan.stdout is not None and orphan.stdout.readline() == "inside\n"
        assert leftover in sweep_leftovers()
        assert list_namespaces(leftover) == []
        assert orphan.wait(timeout=5) != 0
    finally:
        orphan.kill()
        subprocess.run(["ip", "netns", "delete", leftover], capture_output=True)
