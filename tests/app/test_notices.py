"""Flooding notices are limited in rate; a cluster failure is said by its own errors."""

from __future__ import annotations

import errno
import os

from zeroconf import NonUniqueNameException

from exo_tui.app.failures import cluster_failure
from exo_tui.app.notices import NoticeRate


def test_one_notice_per_interval_and_the_next_says_how_many_were_held_back() -> None:
    now = [100.0]
    rate = NoticeRate(10.0, clock=lambda: now[0])
    assert rate.allow() == 0
    allowed = []
    for _ in range(299):
        now[0] += 0.01
        allowed.append(rate.allow())
    assert allowed == [None] * 299
    now[0] += 10.0
    assert rate.allow() == 299
    assert rate.allow() is None


def test_a_cluster_failure_names_its_errors_and_blames_multicast_only_for_mdns() -> None:
    out_of_files = OSError(errno.EMFILE, os.strerror(errno.EMFILE))
    said = cluster_failure(ExceptionGroup("unhandled errors in a TaskGroup", [out_of_files]))
    assert "Too many open files" in said and "multicast" not in said
    assert "TaskGroup" not in said
    mdns = cluster_failure(ExceptionGroup("g", [ExceptionGroup("h", [NonUniqueNameException()])]))
    assert "NonUniqueNameException" in mdns and "--no-mdns" in mdns
