"""``kubedevice demo``: the plugins against the kubelet emulator, on simulated hardware.

:mod:`kubedevice.demo.generic` runs the generic plugin on a fake /dev tree (and holds the
helpers both demos use); :mod:`kubedevice.demo.gpu` runs the GPU plugin on a fake 8-GPU box.
The demos are glue between the two sides (they may import both); they hold no protocol logic.
"""
