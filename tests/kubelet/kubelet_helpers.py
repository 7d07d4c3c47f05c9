"""Helpers shared by the emulator tests (a module name unique across the test tree)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from rawplugin import RawPlugin

PluginFactory = Callable[..., Awaitable[RawPlugin]]


def pod_manifest(
    name: str,
    limits: dict[str, Any] | None = None,
    *,
    init: list[tuple[str, dict[str, Any]]] = (),  # type: ignore[assignment]
    sidecars: list[tuple[str, dict[str, Any]]] = (),  # type: ignore[assignment]
    containers: list[tuple[str, dict[str, Any]]] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    """A Pod manifest; ``limits`` is for one app container ``c`` unless ``containers`` is given."""

    def c(n: str, lim: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {"name": n, "image": "x", "resources": {"limits": lim}, **extra}

    inits = [c(n, lim) for n, lim in init] + [
        c(n, lim, restartPolicy="Always") for n, lim in sidecars
    ]
    apps = [
        c(n, lim) for n, lim in (containers if containers is not None else [("c", limits or {})])
    ]
    spec: dict[str, Any] = {"containers": apps}
    if inits:
        spec["initContainers"] = inits
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
