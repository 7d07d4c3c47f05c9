"""The /dev DRA driver (`kubedevice run --dra`): a Driver on the DRA kit (:mod:`kubedevice.dra`).

``driver`` publishes the same scan as the device plugin (:mod:`kubedevice.generic`), from the
same config, as DRA devices: names, attributes, CDI edits, hot-plug by inotify.
"""

from kubedevice.generic.dra.driver import (
    DEFAULT_DRIVER_NAME,
    GenericDraDriver,
    build_devices,
    device_name,
)

__all__ = ["DEFAULT_DRIVER_NAME", "GenericDraDriver", "build_devices", "device_name"]
