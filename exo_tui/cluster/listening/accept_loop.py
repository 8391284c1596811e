"""The control port's accept loop: a failing accept pauses it and a failing connection is
closed, but neither ends the server.

anyio's `Listener.serve` ends at the first error from accept (EMFILE when descriptors run out,
ECONNABORTED for a connection reset while queued), and takes the node down with it.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
from anyio.streams.stapled import MultiListener

log = logging.getLogger(__name__)

PAUSES_S = (0.05, 0.1, 0.25, 0.5, 1.0)  # after failed accepts in a row, the last one repeated

Handler = Callable[[anyio.abc.SocketStream], Awaitable[None]]


async def serve(listener: MultiListener[anyio.abc.SocketStream], handle: Handler) -> None:
    """Accept connections on every socket of `listener` (what anyio.create_tcp_listener makes)
    and handle each in its own task, until cancelled or the listener is closed."""
    sockets = [one for one in listener.listeners if isinstance(one, anyio.abc.SocketListener)]
    async with anyio.create_task_group() as tasks:
        for one in sockets:
            tasks.start_soon(_accept_forever, one, handle, tasks)


async def _accept_forever(
    listener: anyio.abc.SocketListener,
    handle: Handler,
    tasks: anyio.abc.TaskGroup,
) -> None:
    failures = 0
    while True:
        try:
            stream = await listener.accept()
        except anyio.ClosedResourceError:
            return
        except (OSError, anyio.BrokenResourceError) as error:
            pause = PAUSES_S[min(failures, len(PAUSES_S) - 1)]
            if failures == 0:
                log.warning("cannot accept a connection (%s); %s", _cause(error), _fix(error))
            failures += 1
            await anyio.sleep(pause)
            continue
        if failures:
            log.warning("accepting connections again, after %d failed accepts", failures)
            failures = 0
        tasks.start_soon(_handle, handle, stream)


async def _handle(handle: Handler, stream: anyio.abc.SocketStream) -> None:
    try:
        await handle(stream)
    except Exception:  # one connection's failure, even a bug, must not end the node
        log.exception("a connection ended with an unexpected error; the node goes on")
        await anyio.aclose_forcefully(stream)


def _cause(error: BaseException) -> BaseException:
    # anyio wraps some socket errors in BrokenResourceError; the OSError says what happened.
    return error.__cause__ if isinstance(error.__cause__, OSError) else error


def _fix(error: BaseException) -> str:
    if getattr(_cause(error), "errno", None) in (errno.EMFILE, errno.ENFILE):
        return (
            "out of file descriptors: the node keeps serving and accepts again as connections "
            "close; raise the limit with `ulimit -n` before starting it"
        )
    return "retrying"
