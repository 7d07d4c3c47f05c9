"""Turning SIGTERM/SIGINT into a clean stop of an asyncio program (used by every daemon).

A leaf module shared by the plugin side and the kubelet side: it knows nothing of either.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

__all__ = ["STOP_SIGNALS", "stop_on_signals"]

#: The signals that ask a kubedevice daemon to stop cleanly.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT set ``stop`` instead of killing the process.

    Must be entered on the running event loop of the main thread; the default handlers
    are restored on exit.
    """
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
