"""``kubedevice demo``: the main job on an embedded default (emulator + generic plugin)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import click

from kubedevice.errors import KubeDeviceError

__all__ = ["COMMANDS"]


@click.command("demo")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    show_default="a temp dir, removed at the end",
    help="Keep the fake host, the sockets and the logs here.",
)
@click.option("--gpu", is_flag=True, help="The NVIDIA GPU plugin on a fake 8-GPU NVLink box.")
def demo(workdir: Path | None, gpu: bool) -> None:
    """Run the generic plugin on a simulated /dev tree against the kubelet emulator.

    Registers, shows capacity, admits pods, unplugs and re-plugs a device, simulates a
    kubelet restart, shows what each container would get, and stops cleanly. No cluster
    and no real devices are needed.
    """
    from kubedevice.demo.generic import run_demo  # lazy: keeps other commands' start-up short

    if gpu:
        from kubedevice.demo.gpu import run_gpu_demo as run_demo

    if workdir is not None:
        try:
            workdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a usage error: one line, status 2, as every command
            click.echo(f"error: --workdir: {exc}", err=True)
            sys.exit(2)
    start = time.monotonic()
    try:
        asyncio.run(run_demo(lambda text: click.echo(text), workdir=workdir))
    except (KubeDeviceError, OSError) as exc:
        click.echo(f"demo failed: {exc}", err=True)
        sys.exit(1)
    click.echo(f"\ndemo finished in {time.monotonic() - start:.1f}s")


COMMANDS: list[click.Command] = [demo]
