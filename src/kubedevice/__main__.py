"""``python -m kubedevice``: the same as the ``kubedevice`` command."""

from kubedevice.cli import main

main()
