"""The ``kubedevice`` command: a click group whose subcommands live one per module.

No logic here: each subcommand module parses options, calls the library, and maps
:mod:`kubedevice.errors` to exit codes.
"""

from kubedevice.cli.main import cli, main

__all__ = ["cli", "main"]
