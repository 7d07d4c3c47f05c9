"""Changing the plugins a PluginServer hosts all or nothing (what a config reload needs).

A reload adds some plugins and removes others. :class:`PluginSwap` first checks every
new plugin the way :meth:`PluginServer.add` would (resource name, socket name, hooks,
socket path length) and the new set as a whole (no resource or socket name twice),
touching nothing; then binds the new sockets, freeing first a socket that a plugin being
removed holds under the same name; if a bind still fails, what was done is undone. The
caller may :meth:`~PluginSwap.undo` it after a later step of its own fails (writing a
file), and :meth:`~PluginSwap.finish` it once the reload is committed. The generic and
the GPU plugin daemons both reload through it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kubedevice.errors import ConfigError, KubeDeviceError

if TYPE_CHECKING:
    from kubedevice.plugin.base import DevicePlugin
    from kubedevice.plugin.server import PluginServer

__all__ = ["PluginSwap"]

log = logging.getLogger(__name__)


class _State(enum.Enum):
    NEW = "new"
    CHECKED = "checked"
    APPLIED = "applied"
    DONE = "done"  # finished or undone


class PluginSwap:
    """Adds ``add`` to ``server`` and removes ``remove`` from it, all or nothing.

    Args:
        server: A running server.
        add: Plugins to serve (not served yet).
        remove: Plugins the server serves now that the new state no longer has.
    """

    def __init__(
        self,
        server: PluginServer,
        *,
        add: Sequence[DevicePlugin] = (),
        remove: Sequence[DevicePlugin] = (),
    ) -> None:
        self.server = server
        self.add = list(add)
        self.remove = list(remove)
        self._state = _State.NEW
        self._added: list[DevicePlugin] = []
        self._freed: list[DevicePlugin] = []

    def check(self) -> None:
        """Check everything that can be known before anything is touched (idempotent).

        Raises:
            ConfigError: A new plugin's resource or socket name is unusable or already
                taken by a plugin that stays (or another new one), a hook is wrong, or a
                socket path would be too long; nothing was changed.
        """
        if self._state is not _State.NEW:
            return
        served = set(self.server.resource_names)
        leaving = {p.validated_resource_name() for p in self.remove}
        unknown = sorted(leaving - served)
        if unknown:
            raise ConfigError(f"resource {unknown[0]!r} is not served; it cannot be removed")
        sockets: dict[str, str] = {}  # socket name -> resource, of what stays
        for name in served - leaving:
            sockets[self.server.socket_path(name).name] = name
        resources = served - leaving
        for plugin in self.add:
            try:
                resource, socket_name = self.server.check_plugin(plugin)
            except KubeDeviceError as exc:
                raise ConfigError(f"{exc}; nothing was changed") from exc
            if resource in resources:
                raise ConfigError(
                    f"resource {resource!r} would be served twice; nothing was changed"
                )
            holder = sockets.get(socket_name)
            if holder is not None:
                raise ConfigError(
                    f"{resource}: socket name {socket_name!r} is already used by {holder}; "
                    "nothing was changed"
                )
            resources.add(resource)
            sockets[socket_name] = resource
        self._state = _State.CHECKED

    async def apply(self) -> None:
        """Check, then serve every new plugin; on a failure, undo and raise.

        A plugin being removed whose socket name a new one takes is removed first (and
        put back on a failure). The other removals wait for :meth:`finish`.

        Raises:
            ConfigError: A check failed or a new plugin could not be served; nothing was
                changed.
        """
        self.check()
        if self._state is not _State.CHECKED:
            raise RuntimeError(f"PluginSwap is {self._state.value}; it can be applied once")
        holders = {p.effective_socket_name(): p for p in self.remove}
        self._state = _State.APPLIED
        try:
            for plugin in self.add:
                holder = holders.get(plugin.effective_socket_name())
                if holder is not None:
                    await self.server.remove(holder.validated_resource_name())
                    self._freed.append(holder)
                await self.server.add(plugin)
                self._added.append(plugin)
        except KubeDeviceError as exc:
            await self.undo()
            raise ConfigError(f"{exc}; nothing was changed") from exc

    async def undo(self) -> None:
        """Remove what :meth:`apply` added and serve again what it freed.

        Raises:
            KubeDeviceError: A freed plugin cannot be served again (the old state is then
                not fully back: a failure part-way).
        """
        if self._state is not _State.APPLIED:
            return
        self._state = _State.DONE
        for plugin in reversed(self._added):
            await self.server.remove(plugin.validated_resource_name())
        self._added = []
        failed: list[str] = []
        for plugin in self._freed:
            try:
                await self.server.add(plugin)
            except KubeDeviceError as exc:
                log.error("cannot serve %s again: %s", plugin.resource_name, exc)
                failed.append(plugin.validated_resource_name())
        self._freed = []
        if failed:
            raise KubeDeviceError(f"could not serve {', '.join(failed)} again")

    async def finish(self) -> None:
        """Remove the plugins to remove that :meth:`apply` has not already removed."""
        if self._state is not _State.APPLIED:
            raise RuntimeError(f"PluginSwap is {self._state.value}; apply it first")
        self._state = _State.DONE
        freed = {id(p) for p in self._freed}
        for plugin in self.remove:
            if id(plugin) not in freed:
                await self.server.remove(plugin.validated_resource_name())
