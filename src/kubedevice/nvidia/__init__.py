"""The NVIDIA GPU device plugin (``kubedevice nvidia``), built on the SDK; plugin side only.

Install with ``pip install 'kubedevice[nvidia]'`` for the real NVML backend
(nvidia-ml-py); the fake backend (:mod:`kubedevice.nvidia.fake`) needs nothing.
"""
