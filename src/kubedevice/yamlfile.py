"""Reading a YAML file strictly: the one place configs and kubeconfigs meet hostile YAML.

Duplicate keys are refused, integers too long for any field load as :class:`HugeInt`
(never converted), a file larger than :data:`MAX_BYTES` or with more than
:data:`MAX_EXPANDED_NODES` values is refused while it is read (before its nodes are built),
a document whose aliases would expand past :data:`MAX_EXPANDED_NODES` nodes (a "billion
laughs" file) before it is built, one nested too deeply in one line too, and every error
names the file (and the line and column of a syntax error). A leaf module (PyYAML and
``_regular_file`` only), shared by the generic plugin's and the GPU plugin's configs and
every kubeconfig reader (:mod:`kubedevice.kubeconfig_rules`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kubedevice._regular_file import read_regular
from kubedevice.errors import ConfigError

__all__ = ["MAX_BYTES", "MAX_EXPANDED_NODES", "HugeInt", "read_yaml"]

#: Integers with more digits than this are out of range for every field (int64 has 19).
_MAX_INT_DIGITS = 20

#: Most nodes a config may expand to through aliases; real configs have a few hundred.
MAX_EXPANDED_NODES = 100_000
#: The largest file read (a kubeconfig with the certificates of 500 clusters is 1 MiB).
MAX_BYTES = 16 << 20


class HugeInt:
    """What a YAML integer with more than 20 digits loads as.

    It is never converted to an ``int``: Python refuses that beyond 4300 digits (a
    ``ValueError`` deep in the YAML loader) and below that it is only slow. Every field
    refuses it, so the error names the field like any other out-of-range value.
    """

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"


# libyaml's parser when PyYAML was built with it: about 15 times faster on a large file (a
# 300,000-item list is refused in under 2 s instead of 25).
if TYPE_CHECKING:
    _BaseLoader = yaml.SafeLoader
else:
    _BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_BaseLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys and never builds huge integers."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _value in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # keys merged in with "<<" may be overridden
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key: let the model report it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


def _construct_int(loader: _StrictLoader, node: yaml.ScalarNode) -> Any:
    body = str(loader.construct_scalar(node)).replace("_", "").lstrip("+-")
    if len(body) > _MAX_INT_DIGITS + 2:  # + 2: room for a 0x, 0o or 0b prefix
        return HugeInt(len(body))
    return yaml.SafeLoader.construct_yaml_int(loader, node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes ``root`` stands for once every alias is expanded (bounded).

    Aliases share a node object, so sizes are memoised per node: the walk costs the
    size of the file, not of its expansion.

    Raises:
        ConfigError: It expands past :data:`MAX_EXPANDED_NODES` (the message says whether
            the file itself is that large or its aliases make it so) or refers to itself.
    """
    sizes: dict[int, int] = {}
    busy: set[int] = set()
    written: set[int] = set()  # the nodes in the file itself, each counted once

    def too_big() -> ConfigError:
        if len(written) > MAX_EXPANDED_NODES:
            return ConfigError(
                f"too large: more than {MAX_EXPANDED_NODES:,} values (lists, mappings and "
                "scalars); refused"
            )
        return ConfigError(f"aliases expand it to more than {MAX_EXPANDED_NODES:,} nodes; refused")

    def size(node: yaml.Node) -> int:
        key = id(node)
        written.add(key)
        if isinstance(node, yaml.ScalarNode):
            return 1
        known = sizes.get(key)
        if known is not None:
            return known
        if key in busy:
            raise ConfigError("an alias refers to a node that contains it")
        busy.add(key)
        children: list[yaml.Node] = (
            [n for pair in node.value for n in pair]
            if isinstance(node, yaml.MappingNode)
            else list(node.value)
        )
        total = 1
        for child in children:
            total += size(child)
            if total > MAX_EXPANDED_NODES:
                raise too_big()
        busy.discard(key)
        sizes[key] = total
        return total

    return size(root)


def _count_events(text: str, source: str) -> None:
    """Refuse ``text`` once it has more values than :data:`MAX_EXPANDED_NODES`, counted by
    the parser alone (building the nodes of a 100,000-entry list takes seconds; this pass
    stops at the limit in a tenth of one).

    Raises:
        ConfigError: Too many values (a syntax error is left to the load, which says where).
    """
    starts = (yaml.ScalarEvent, yaml.AliasEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)
    seen = 0
    try:
        for event in yaml.parse(text, Loader=_BaseLoader):
            if isinstance(event, starts):
                seen += 1
                if seen > MAX_EXPANDED_NODES:
                    raise ConfigError(
                        f"{source}: too large: more than {MAX_EXPANDED_NODES:,} values (lists, "
                        "mappings and scalars); refused"
                    )
    except (yaml.YAMLError, RecursionError):
        return


def read_yaml(path: str | Path) -> Any:
    """Read the YAML file at ``path`` strictly; ``None`` when it is empty.

    Raises:
        ConfigError: It cannot be read, is not UTF-8, is not valid YAML, or its aliases
            expand too far; the message names the file (and where the YAML breaks).
    """
    source = str(path)
    try:
        # a FIFO planted there never blocks; a ConfigMap's symlinks are followed
        data = read_regular(path, MAX_BYTES, follow_symlinks=True)
        if len(data) > MAX_BYTES:
            raise ConfigError(f"{source}: larger than {MAX_BYTES >> 20} MiB; refused")
        text = data.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text: invalid byte at offset {exc.start}") from None
    _count_events(text, source)
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            _expanded_size(node)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        except RecursionError:
            raise ConfigError(f"{source}: nested too deeply") from None
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}: invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    except (ValueError, OverflowError) as exc:  # a scalar its tag cannot take (2001-13-45)
        raise ConfigError(f"{source}: invalid YAML: {' '.join(str(exc).split())[:200]}") from None
    finally:
        loader.dispose()
