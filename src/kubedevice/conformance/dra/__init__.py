"""DRA conformance kit (kubelet side): run a DRA driver, play the kubelet, judge it.

``kubedevice conformance --dra -- CMD ARGS...`` starts the driver in a kubelet directory of
its own, registers it as the plugin watcher does, calls its DRA and health services as the
kubelet does, and judges what it does over its sockets, in the CDI dir and in a real API
server. Entry points: :func:`check_driver` (sync) and :func:`run_dra_conformance` (async)
return the same :class:`~kubedevice.conformance.Report` as the device-plugin kit; the cases
are :data:`DRA_CASES` (docs/conformance.md lists them). Never imports a driver kit.
"""

from kubedevice.conformance.dra.catalogue import DRA_CASES as DRA_CASES
from kubedevice.conformance.dra.context import TEMPLATES as TEMPLATES, DraOptions as DraOptions
from kubedevice.conformance.dra.runner import (
    check_driver as check_driver,
    run_dra_conformance as run_dra_conformance,
)

__all__ = ["DRA_CASES", "TEMPLATES", "DraOptions", "check_driver", "run_dra_conformance"]
