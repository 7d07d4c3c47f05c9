"""Choosing an NVML backend from a spec string: ``real`` or ``fake:PATH``."""

from __future__ import annotations

from kubedevice.errors import ConfigError
from kubedevice.nvidia.backend import NvmlBackend

__all__ = ["open_backend"]


def open_backend(spec: str) -> NvmlBackend:
    """The backend a spec names, not yet initialised (call ``init()``).

    * ``real``: NVML through nvidia-ml-py (``pip install 'kubedevice[nvidia]'``);
      the library itself is loaded only by ``init()``.
    * ``fake:PATH``: :class:`~kubedevice.nvidia.fake.FakeNvml` on a machine file;
      PATH may be a packaged machine's bare name (``fake:dgx-8gpu``) or ``BASE+LOAD``
      (``fake:h200+h200-load``).

    Raises:
        ConfigError: the spec is neither form, or the fake machine file is bad.
    """
    text = spec.strip()
    if text == "real":
        from kubedevice.nvidia.nvml_real import RealNvml

        return RealNvml()
    kind, sep, rest = text.partition(":")
    if kind == "fake" and sep:
        if not rest:
            raise ConfigError("nvml: 'fake:' needs a machine file or name, e.g. fake:dgx-8gpu")
        from kubedevice.nvidia.fake import FakeNvml

        return FakeNvml.from_file(rest)
    raise ConfigError(f"nvml: {spec!r} is not 'real' or 'fake:PATH' (e.g. fake:dgx-8gpu)")
