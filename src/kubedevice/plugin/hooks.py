"""A plugin's hooks as the server calls them: checked when added, plain functions off the loop.

:func:`check_hooks` runs when a plugin is added to a server: a hook whose signature cannot
take the server's arguments, or a ``devices()`` written as ``async def`` without ``yield``,
is refused there with a :class:`~kubedevice.errors.ConfigError` naming the hook, instead of
failing later when the kubelet calls it. :func:`async_hook` turns every hook into a
coroutine function: ``async def`` hooks are used as they are (no cost), plain functions
run in a worker thread so they cannot block the event loop. :func:`device_snapshots`
iterates ``devices()``, an async generator or a plain generator (run in a daemon thread,
so one blocked between two snapshots never holds up shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from kubedevice.errors import ConfigError

if TYPE_CHECKING:
    from kubedevice.plugin.base import DevicePlugin
    from kubedevice.plugin.types import Device

__all__ = ["HOOK_PARAMETERS", "async_hook", "check_hooks", "device_snapshots"]

#: The arguments the server passes to each hook (positionally), for messages and checks.
HOOK_PARAMETERS: Final[dict[str, tuple[str, ...]]] = {
    "devices": (),
    "allocate": ("devices",),
    "preferred_allocation": ("available", "must_include", "size"),
    "pre_start": ("devices",),
}


def check_hooks(plugin: DevicePlugin) -> None:
    """Refuse a plugin whose overridden hooks the server could not call.

    Args:
        plugin: The plugin being added.

    Raises:
        ConfigError: A hook is not callable, does not accept the server's arguments, or
            ``devices()`` is an ``async def`` without ``yield`` (a coroutine, not an
            iterator of snapshots).
    """
    from kubedevice.plugin.base import DevicePlugin

    cls = type(plugin)
    own = getattr(plugin, "__dict__", {})
    for name, params in HOOK_PARAMETERS.items():
        hook = getattr(plugin, name, None)
        if getattr(cls, name, None) is getattr(DevicePlugin, name) and name not in own:
            continue  # the base class's own: fine
        call = f"{name}({', '.join(params)})"
        where = f"{cls.__name__}.{name}"
        if not callable(hook):
            raise ConfigError(f"{where} is not callable; the server calls {call}")
        try:
            sig = inspect.signature(hook)
        except (TypeError, ValueError):
            continue  # a builtin or C callable: nothing to check
        try:
            sig.bind(*params)
        except TypeError as exc:
            raise ConfigError(
                f"{where}{_shown(hook)} cannot be called as {call}: {exc}; its signature "
                f"must be {name}(self{''.join(', ' + p for p in params)})"
            ) from None
        if name == "devices" and _is_coroutine_function(hook):
            raise ConfigError(
                f"{where} is 'async def' without 'yield': it must yield each full device "
                "snapshot (an async generator, or a plain generator), not return one"
            )


def _shown(hook: Any) -> str:
    """The hook's parameters as written (``(self, a, b=1)``), without annotations."""
    empty = inspect.Parameter.empty
    func = getattr(hook, "__func__", hook)  # the function, with its ``self``
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):  # pragma: no cover - checked by the caller already
        return "(...)"
    bare = [p.replace(annotation=empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=bare, return_annotation=empty))


def _is_coroutine_function(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) and not inspect.isasyncgenfunction(fn)


def async_hook(hook: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """``hook`` as a coroutine function; a plain function runs in a worker thread.

    Args:
        hook: A bound hook method.

    Returns:
        ``hook`` itself when it is ``async def``, else a wrapper that calls it with
        ``asyncio.to_thread`` (and awaits what it returns if that is awaitable).
    """
    if inspect.iscoroutinefunction(hook):
        return hook

    async def in_thread(*args: Any) -> Any:
        result = await asyncio.to_thread(hook, *args)
        if inspect.isawaitable(result):
            result = await result
        return result

    return in_thread


async def device_snapshots(plugin: DevicePlugin) -> AsyncIterator[Sequence[Device]]:
    """Iterate ``plugin.devices()``, whether it is an async or a plain generator.

    Args:
        plugin: The plugin.

    Yields:
        Each snapshot the plugin yields.

    Raises:
        TypeError: ``devices()`` returned neither an async iterator nor an iterator.
    """
    source: Any = plugin.devices()
    if hasattr(source, "__aiter__"):
        async for snapshot in source:
            yield snapshot
        return
    if inspect.iscoroutine(source):
        source.close()
        raise TypeError("devices() returned a coroutine; it must yield snapshots")
    if not isinstance(source, Iterator):
        raise TypeError(
            f"devices() returned {type(source).__name__}; it must be a generator or an "
            "async generator yielding full device snapshots"
        )
    async for snapshot in _in_thread(source):
        yield snapshot


_END = object()


async def _in_thread(source: Iterator[Any]) -> AsyncIterator[Any]:
    """Drive a blocking iterator in a daemon thread, one item at a time.

    A daemon thread, not the default executor: a generator blocked between two snapshots
    (``time.sleep``, a blocking read) must not keep the process alive at shutdown.
    """
    loop = asyncio.get_running_loop()
    ready: asyncio.Queue[tuple[Any, BaseException | None]] = asyncio.Queue(maxsize=1)
    wanted = threading.Semaphore(0)
    stop = threading.Event()

    def put(item: Any, error: BaseException | None) -> None:
        ready.put_nowait((item, error))

    def run() -> None:
        try:
            while True:
                wanted.acquire()
                if stop.is_set():
                    return
                try:
                    item = next(source, _END)
                except BaseException as exc:  # handed to the loop, re-raised there
                    loop.call_soon_threadsafe(put, _END, exc)
                    return
                if stop.is_set():
                    return
                loop.call_soon_threadsafe(put, item, None)
                if item is _END:
                    return
        except RuntimeError:
            pass  # the loop closed while we were blocked: nobody is waiting any more
        finally:
            close = getattr(source, "close", None)
            if close is not None and stop.is_set():
                with contextlib.suppress(Exception):  # the consumer has gone already
                    close()

    thread = threading.Thread(target=run, name="kubedevice devices()", daemon=True)
    thread.start()
    try:
        while True:
            wanted.release()
            item, error = await ready.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        stop.set()
        wanted.release()
