"""CLI subcommands (placeholder; filled in by the owning work item)."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
