"""The cluster across network namespaces joined by a bridge: one `exo-tui node` per namespace.

Real mDNS, real TCP between addresses, MLX's ring across them, faults by SIGKILL and by
`ip link set DEV down`. Root only (skipped elsewhere); the loopback variants of these tests are
in test_node.py, test_coordinator.py and tests/cli/test_cluster_chat_cli.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.cluster.conftest import NetnsCluster
from tests.cluster.json_lines import JsonLines, Line
from tests.cluster.netns import NetnsNode

KEY = "netns-cluster-key-ASoOkBA6p5u12z05yVSecHrucC-9nIcSVkgmC1Nckdk"
STRANGER_KEY = "a-different-key-ZL95CsbOqq1YSCEKPSo1MV-hPDniV1men-dVYIbP02E"
ROOT = Path(__file__).resolve().parents[2]
EXO_TUI = [sys.executable, "-m", "exo_tui.cli"]


class Running:
    def __init__(self, where: NetnsNode, process: subprocess.Popen[str]) -> None:
        self.where = where
        self.process = process
        assert process.stdout is not None
        self.lines = JsonLines(process.stdout)

    def first(self, kind: str, timeout: float = 30) -> Line:
        seen = self.lines.wait_for(lambda lines: any(x.get("type") == kind for x in lines), timeout)
        return next(x for x in seen if x.get("type") == kind)

    def peers(self) -> set[str]:
        return {x["node_id"] for x in self.lines.lines if x.get("type") == "peer_stats"}

    def runners(self) -> list[int]:
        """Runner processes under this one (they are what must never be left spinning)."""
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        found: list[int] = []
        for child in children:
            try:
                if "exo_tui.cluster.worker.runner" in " ".join(child.cmdline()):
                    found.append(child.pid)
            except psutil.NoSuchProcess:
                pass
        return found


def start(where: NetnsNode, home: Path, *args: str) -> Running:
    env = {k: v for k, v in os.environ.items() if k != "EXO_TUI_KEY"}
    env["EXO_TUI_HOME"] = str(home / where.name)
    env["TMPDIR"] = str(home / where.name)  # its ring folders: a node a test kills leaves them
    (home / where.name).mkdir(parents=True, exist_ok=True)
    process = where.run(
        [*EXO_TUI, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return Running(where, process)


def node(where: NetnsNode, home: Path, models: Path, key: str = KEY) -> Running:
    return start(where, home, "node", "--json", "--key", key, "--models-dir", str(models))


@pytest.fixture
def models(tiny_llama: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "store"
    shutil.copytree(tiny_llama, folder / "tiny-llama")
    return folder


def wait(predicate, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(0.05)


def test_three_nodes_find_each_other_over_mdns_within_3_s(
    netns_cluster: NetnsCluster, models: Path, tmp_path: Path
) -> None:
    spaces = netns_cluster(3)
    nodes = [node(space, tmp_path, models) for space in spaces]
    ids = [n.first("listening")["node_id"] for n in nodes]
    listening = time.monotonic()
    for me, running in zip(ids, nodes, strict=True):
        others = set(ids) - {me}
        running.lines.wait_for(lambda _, r=running, o=others: r.peers() >= o, timeout=3)
    assert time.monotonic() - listening < 3
    stats = next(x for x in nodes[0].lines.lines if x.get("type") == "peer_stats")
    assert "tiny-llama" in stats["models"]


def test_a_node_with_another_key_is_shown_as_foreign_and_never_trusted(
    netns_cluster: NetnsCluster, models: Path, tmp_path: Path
) -> None:
    a, b, stranger_space = netns_cluster(3)
    first, second = node(a, tmp_path, models), node(b, tmp_path, models)
    stranger = node(stranger_space, tmp_path, models, key=STRANGER_KEY)
    stranger_id = stranger.first("listening")["node_id"]
    foreign = first.first("foreign", timeout=5)
    assert foreign["peer"]["node_id"] == stranger_id
    second.lines.wait_for(lambda _: first.first("listening")["node_id"] in second.peers(), 5)
    time.sleep(1.5)
    assert stranger_id not in first.peers() | second.peers()
    assert not stranger.peers()


def chat(where: NetnsNode, home: Path, models: Path, node_ids: list[str], *args: str) -> Running:
    return start(
        where, home, "chat", "--cluster", "--json", "--key", KEY, "--models-dir", str(models),
        "--model", "tiny-llama", "--prompt", "tell me about this cluster", "--temperature", "0",
        "--nodes", ",".join(node_ids), "--discover", "2.5", "--no-tools", *args,
    )  # fmt: skip


def alone(models: Path, max_tokens: int) -> list[int]:
    result = subprocess.run(
        [*EXO_TUI, "chat", "--json", "--models-dir", str(models), "--model", "tiny-llama",
         "--prompt", "tell me about this cluster", "--temperature", "0", "--no-tools",
         "--max-tokens", str(max_tokens)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    import json

    done = [json.loads(x) for x in result.stdout.splitlines() if '"done"' in x][-1]
    return list(done["token_ids"])


@pytest.mark.parametrize(("strategy", "count"), [("pipeline", 3), ("tensor", 2)])
def test_chat_across_namespaces_is_token_identical_to_one_process(
    netns_cluster: NetnsCluster, models: Path, tmp_path: Path, strategy: str, count: int
) -> None:
    spaces = netns_cluster(count + 1)
    nodes = [node(space, tmp_path, models) for space in spaces[:count]]
    ids = [n.first("listening")["node_id"] for n in nodes]
    session = chat(spaces[-1], tmp_path, models, ids, "--strategy", strategy, "--max-tokens", "40")
    done = session.first("done", timeout=120)
    loads = [x for x in session.lines.lines if x.get("type") == "load"]
    for node_id in ids:  # every node's bar reached n/n
        last = [x for x in loads if x["node_id"] == node_id][-1]
        assert last["layers_loaded"] == last["total"] > 0
    assert done["token_ids"] == alone(models, 40)
    assert session.process.wait(timeout=30) == 0
    wait(lambda: not any(n.runners() for n in nodes), 10)


def test_a_cut_link_mid_generation_fails_within_5_s_and_stops_the_other_ranks(
    netns_cluster: NetnsCluster, models: Path, tmp_path: Path
) -> None:
    spaces = netns_cluster(3)
    nodes = [node(space, tmp_path, models) for space in spaces[:2]]
    ids = [n.first("listening")["node_id"] for n in nodes]
    session = chat(spaces[-1], tmp_path, models, ids, "--max-tokens", "100000")
    session.first("text", timeout=120)
    cut = time.monotonic()
    spaces[1].link_down()
    error = session.first("error", timeout=5)
    assert time.monotonic() - cut < 5
    assert error["message"]
    wait(lambda: not nodes[0].runners(), 10)
    assert time.monotonic() - cut < 10
    # The link comes back: the node is usable again.
    spaces[1].link_up()
    nodes[0].lines.wait_for(
        lambda lines: sum(1 for x in lines if x.get("type") == "peer_stats" and x["joined"]
                          and x["node_id"] == ids[1]) >= 2,
        timeout=15,
    )  # fmt: skip
