"""The fake NVML backend, in one package: GPUs read from a JSON file, health events injected.

``nvml`` the backend (:class:`FakeNvml`), ``machine`` the machine model and finding/reading
machine files, ``load`` the three file kinds (NVML recordings parsed here), ``synthetic`` the
synthetic format, ``replay`` load recordings played as a timeline, ``control`` the control
messages and their socket, ``partitions`` MIG devices made and destroyed on demand. This
package's names (those of ``nvml.__all__``) are the fake's public face.
"""

from kubedevice.nvidia.fake.nvml import *  # noqa: F403 (the public face, as nvml lists it)
from kubedevice.nvidia.fake.nvml import __all__ as __all__
