"""What ended the app's part in the cluster, said by the errors themselves."""

from __future__ import annotations

from exo_tui.untrusted import REASON_LIMIT, shown


def cluster_failure(error: BaseException) -> str:
    """Every error that ended the node (a task group wraps them in groups), with multicast
    named as the cause only when mDNS is what failed."""
    leaves = error.exceptions if isinstance(error, BaseExceptionGroup) else (error,)
    said: list[str] = []
    for leaf in leaves:
        if isinstance(leaf, BaseExceptionGroup):
            said.append(cluster_failure(leaf))
            continue
        text = shown(f"{type(leaf).__name__}: {leaf}", REASON_LIMIT)
        if type(leaf).__module__.split(".")[0] == "zeroconf":
            text += " (mDNS failed: --no-mdns with --peer HOST:PORT avoids multicast)"
        said.append(text)
    return "; ".join(said)
