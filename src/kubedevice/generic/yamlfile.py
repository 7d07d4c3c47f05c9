"""Reading a YAML config file strictly: duplicate keys refused, errors naming file and line.

A leaf module (PyYAML only), shared by the generic plugin's and the GPU plugin's configs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kubedevice.errors import ConfigError

__all__ = ["read_yaml"]


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate mapping keys (PyYAML keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _value in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # keys merged in with "<<" may be overridden
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key: let pydantic report it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str | Path) -> Any:
    """Read the YAML file at ``path`` (duplicate keys refused); ``None`` when it is empty.

    Raises:
        ConfigError: It cannot be read, is not UTF-8 or is not valid YAML; the message
            names the file (and the line and column of a syntax error).
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text: invalid byte at offset {exc.start}") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: safe
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}: invalid YAML{where}: {problem}") from None
