"""Plugins used by several SDK tests."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager

import kubedevice


class StaticPlugin(kubedevice.DevicePlugin):
    """A plugin whose devices are given to the constructor (and pushed with update())."""

    def __init__(
        self, devices: Sequence[kubedevice.Device], resource_name: str = "example.com/dev"
    ) -> None:
        self.resource_name = resource_name
        self.initial = list(devices)

    async def devices(self) -> AsyncIterator[Sequence[kubedevice.Device]]:
        yield self.initial


class _LogEvent(logging.Handler):
    def __init__(self, needle: str, event: asyncio.Event) -> None:
        super().__init__(logging.DEBUG)
        self.needle = needle
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.event.set()


@contextmanager
def log_event(needle: str) -> Iterator[asyncio.Event]:
    """An event set when kubedevice logs a message containing ``needle`` (same thread)."""
    event = asyncio.Event()
    handler = _LogEvent(needle, event)
    logger = logging.getLogger("kubedevice")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield event
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
