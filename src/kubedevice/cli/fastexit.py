"""Ending a plugin daemon's process once it has stopped: at once, without the teardown.

A daemon that stopped cleanly (its sockets removed, its threads joined) has nothing left
for the interpreter's own teardown to do but collect every object it ever built, which
took 0.2 s of the 0.3 s between SIGTERM and exit for the generic plugin with 1,000
devices. The kubelet, an orchestrator's rolling update and ``kubectl delete pod`` all wait
for that exit. What the interpreter runs at exit that matters (``atexit`` handlers, grpc's
shutdown among them; log handlers; stdio buffers) still runs.

Only the ``kubedevice`` command does this (:func:`kubedevice.cli.main` sets it up); a
command invoked in-process (tests, ``CliRunner``) returns as usual.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys

import click

__all__ = ["OWN_PROCESS", "end_process_after_stop", "owns_process"]

#: The key in the click context's ``obj`` that says the command owns the process.
OWN_PROCESS = "kubedevice.own_process"


def owns_process() -> bool:
    """Whether the running command owns the process (the ``kubedevice`` command itself)."""
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    return isinstance(obj, dict) and bool(obj.get(OWN_PROCESS))


def end_process_after_stop(code: int = 0) -> None:
    """End the process with ``code`` when the running command owns it; else return."""
    if not owns_process():
        return
    atexit._run_exitfuncs()  # what interpreter exit runs first (grpc's shutdown, finalizers)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
