"""`exo-tui key`: the cluster key (or its fingerprint) on stdout, what to do with it on stderr."""

from __future__ import annotations

import argparse
import os
import sys

from exo_tui.cluster import identity


def show_key(args: argparse.Namespace) -> int:
    """`exo-tui key`: the key (or its fingerprint) on stdout, what to do with it on stderr."""
    key = identity.replace_cluster_key() if args.new else identity.load_cluster_key()
    print(key.fingerprint if args.show_fingerprint else key.text)
    from_env = bool(os.environ.get(identity.KEY_ENV, "").strip())
    if args.new:
        notice = (
            f"new cluster key written to {identity.key_path()} (fingerprint {key.fingerprint}); "
            "nodes still using the old key will be refused until they are given this one"
        )
        if from_env:
            notice += (
                f"; {identity.KEY_ENV} is set, so nodes started from this shell still use that one"
            )
    elif args.show_fingerprint:
        return 0
    else:
        source = f" (from {identity.KEY_ENV})" if from_env else ""
        notice = (
            f"fingerprint {key.fingerprint}{source}; on another machine run "
            f"`exo-tui node --key {key.text}` or set {identity.KEY_ENV}={key.text}"
        )
    print(f"exo-tui: {notice}", file=sys.stderr)
    return 0
