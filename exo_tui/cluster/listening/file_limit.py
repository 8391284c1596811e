"""This process's file-descriptor limit: read it, and raise the soft limit as far as allowed.

mlx-lm sets the limit to (2048, 4096) when it is imported, so the node raises it once everything
it needs is imported: every connection, even one refused, holds a descriptor while it is open.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

HIGHEST_SOFT = 1 << 20  # where the hard limit is unlimited, ask for this much and no more


def soft_file_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return HIGHEST_SOFT if soft == resource.RLIM_INFINITY else soft


def raise_file_limit() -> int:
    """Raise the soft file limit to the hard one (where the system allows); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = HIGHEST_SOFT if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as error:  # e.g. macOS caps the soft limit lower
            log.info("cannot raise the file limit from %d to %d: %s", soft, wanted, error)
    return soft_file_limit()
