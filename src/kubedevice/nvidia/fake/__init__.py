"""The fake NVML backend's parts; its public face is :mod:`kubedevice.nvidia.nvml_fake`.

``machine`` the machine model and finding/reading machine files, ``load`` the three file
kinds (NVML recordings parsed here), ``synthetic`` the synthetic format, ``replay`` load
recordings played as a timeline, ``control`` the control messages and their socket.
"""
