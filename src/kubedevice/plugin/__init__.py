"""The device plugin SDK (plugin side): typed values, the plugin base class, the server.

Plugin authors use it through ``import kubedevice``. Nothing here imports the kubelet side
(:mod:`kubedevice.kubelet`, :mod:`kubedevice.conformance`); both share only ``_api``.

Modules: ``types`` (values), ``base`` (:class:`DevicePlugin`), ``config`` (resource-name
rule, socket names, plugin dir), ``policy`` (GetPreferredAllocation), ``hooks`` (hook
checks, plain functions run in threads), ``servicer`` (the
gRPC service and the ListAndWatch fan-out), ``registration`` (Register + backoff),
``watch`` (inotify), ``server`` (:class:`PluginServer`), ``runner`` (serve/run/main),
``daemon`` (reload, SIGHUP and metrics plumbing shared by the plugin daemons),
``metrics`` (Prometheus, imported only on demand). The plugin daemons' shared kit, never
imported by the modules above: ``configbase`` (config checks
and one-line errors), ``filewatch`` (inotify over directories and the config file),
``files`` (atomic replace), ``cdi`` (CDI spec rules and writing).

Behaviour choices:

* An optional RPC the plugin does not advertise (``PreStartContainer``,
  ``GetPreferredAllocation``) answers ``UNIMPLEMENTED``: the options are honest, and a
  kubelet never calls what is not advertised.
* A failing allocate or pre-start hook gives ``INTERNAL``; a failing preferred-allocation
  hook falls back to the default policy (a kubelet fails the pod's admission on any
  GetPreferredAllocation error, while a short or empty answer would just be filled).
* The plugin registers only once it has a first device list, so the kubelet's first
  ListAndWatch message is immediate.
* Re-registration triggers: our socket deleted, ``kubelet.sock`` re-created (identity by
  device, inode and mtime; not ctime, which a chmod changes), and "the kubelet closed its
  ListAndWatch stream and did not open another within ``stream_grace`` (1 s) while
  ``kubelet.sock`` still exists". The kubelet's stream is the first one opened after our
  Register call started; streams of other clients (monitoring, the conformance kit's
  probes) neither trigger this nor hide it. A real kubelet opens exactly one stream per
  registration and never reopens it: a closed stream with the kubelet still there means
  it dropped us (e.g. kubernetes#121994 after a rolling update), and only a new Register
  brings the resource back. When the kubelet shuts down, ``kubelet.sock`` goes away and
  we wait for it to come back instead.
* Sockets are bound under a temporary name and hard-linked into place, so they appear with
  mode 0600 at once and gRPC's unlink-by-path at shutdown never removes a socket another
  process has put at our path since. A socket found at our path is replaced when it is
  stale; a live one (another instance, e.g. during a rolling update) is taken over by
  ``add()``, but never taken back when re-serving: we retry until it goes away, so two
  instances never fight over one socket name.
* When the device plugin directory is deleted, the watch follows its nearest existing
  ancestor until it is re-created, then serves and registers again there.
* A snapshot whose encoding exceeds 4 MiB is not sent (an error is logged each time);
  Allocate already uses it, the kubelet keeps the previous list.
"""

from kubedevice.plugin.base import (
    DevicePlugin as DevicePlugin,
)
from kubedevice.plugin.config import (
    default_socket_name as default_socket_name,
    resolve_device_plugin_dir as resolve_device_plugin_dir,
    validate_resource_name as validate_resource_name,
)
from kubedevice.plugin.policy import (
    default_preferred_allocation as default_preferred_allocation,
)
from kubedevice.plugin.runner import (
    argument_parser as argument_parser,
    main as main,
    run as run,
    serve as serve,
)
from kubedevice.plugin.server import (
    PluginServer as PluginServer,
    ServerState as ServerState,
)
from kubedevice.plugin.types import (
    DEFAULT as DEFAULT,
    AllocateResult as AllocateResult,
    ContainerAllocation as ContainerAllocation,
    DefaultType as DefaultType,
    Device as Device,
    DeviceSpec as DeviceSpec,
    Health as Health,
    Mount as Mount,
    PluginOptions as PluginOptions,
)

__all__ = [
    "DEFAULT",
    "AllocateResult",
    "ContainerAllocation",
    "DefaultType",
    "Device",
    "DevicePlugin",
    "DeviceSpec",
    "Health",
    "Mount",
    "PluginOptions",
    "PluginServer",
    "ServerState",
    "argument_parser",
    "default_preferred_allocation",
    "default_socket_name",
    "main",
    "resolve_device_plugin_dir",
    "run",
    "serve",
    "validate_resource_name",
]
