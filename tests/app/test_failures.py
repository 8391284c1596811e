"""A cluster failure is said by its own errors, and blames multicast only when mDNS failed."""

from __future__ import annotations

import errno
import os

from zeroconf import NonUniqueNameException

from exo_tui.app.failures import cluster_failure


def test_a_cluster_failure_names_its_errors_and_blames_multicast_only_for_mdns() -> None:
    out_of_files = OSError(errno.EMFILE, os.strerror(errno.EMFILE))
    said = cluster_failure(ExceptionGroup("unhandled errors in a TaskGroup", [out_of_files]))
    assert "Too many open files" in said and "multicast" not in said
    assert "TaskGroup" not in said
    mdns = cluster_failure(ExceptionGroup("g", [ExceptionGroup("h", [NonUniqueNameException()])]))
    assert "NonUniqueNameException" in mdns and "--no-mdns" in mdns
