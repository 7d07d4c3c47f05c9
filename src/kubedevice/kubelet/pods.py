"""Pod manifests: parsing (YAML/JSON, multi-document) and the API server's validation.

Turns a Kubernetes Pod manifest into a ``PodSpec`` holding what the device manager needs
(containers in admission order, their extended-resource limits), and refuses what the API
server would refuse with its wording (``Pod "x" is invalid: spec.containers[0]...``).
Wording follows upstream ``ValidateResourceRequirements`` / ``ValidateResourceQuantityValue``
(including the Go ``%#v`` rendering of a Quantity in ``must be an integer``); keyed paths for
map entries are kept, the order of several errors may differ (Go map order).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import yaml

from kubedevice.errors import ManifestError
from kubedevice.kubelet.registration import is_extended_resource_name
from kubedevice.kubelet.schema import unknown_fields
from kubedevice.kubelet.types import ContainerKind

__all__ = [
    "ContainerSpec",
    "PodSpec",
    "decode_manifest",
    "format_quantity",
    "load_manifests",
    "parse_pod",
    "parse_quantity",
]

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_QUANTITY_MSG = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
#: Longest quantity text accepted (the largest meaningful one, 2**63-1 in nano units with a
#: suffix, has 30 characters; longer ones are refused rather than parsed digit by digit).
MAX_QUANTITY_CHARS = 64
_TOO_LONG = f"quantity is too long (more than {MAX_QUANTITY_CHARS} characters)"
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DEC_SUFFIX = {v: k for k, v in _DECIMAL.items()}
_STANDARD = {"cpu", "memory", "ephemeral-storage"}
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL = re.compile(rf"^{_LABEL}$")
_DNS_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)


@dataclass(frozen=True, slots=True)
class Quantity:
    """A parsed resource quantity: exact value plus the format it was written in.

    ``go_repr`` is what the API server prints for a Quantity passed by value to
    ``field.Invalid`` (Go ``%#v``; used by the ``must be an integer`` error).
    """

    value: Fraction
    fmt: str  # "binary", "decimal" or "exponent"
    go_repr: str = ""

    def __str__(self) -> str:
        return format_quantity(self)


_GO_FORMAT = {"binary": "BinarySI", "decimal": "DecimalSI", "exponent": "DecimalExponent"}


def _go_repr(text: str, num: str, exponent: int, fmt: str) -> str:
    """Go's ``%#v`` of the Quantity ``ParseQuantity(text)`` returns (decimal forms)."""
    negative = num.startswith("-")
    digits = num.lstrip("+-")
    whole, _, frac = digits.partition(".")
    shifted = (whole + frac) or "0"
    value = int(shifted) * (-1 if negative else 1)
    scale = exponent - len(frac)
    canonical = scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"
    cached = text if canonical else ""
    return (
        f"resource.Quantity{{i:resource.int64Amount{{value:{value}, scale:{scale}}}, "
        f"d:resource.infDecAmount{{Dec:(*inf.Dec)(nil)}}, s:{json.dumps(cached)}, "
        f'Format:"{_GO_FORMAT[fmt]}"}}'
    )


def parse_quantity(raw: Any) -> Quantity:
    """Parse a Kubernetes quantity (``1``, ``500m``, ``2Ki``, ``1e3``, YAML numbers)."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ManifestError(_QUANTITY_MSG)
    try:
        text = repr(raw) if isinstance(raw, float) else str(raw)
    except ValueError:  # an int of more digits than Python prints
        raise ManifestError(_TOO_LONG) from None
    if len(text) > MAX_QUANTITY_CHARS:
        raise ManifestError(_TOO_LONG)
    m = _QUANTITY.match(text.strip())
    if not m:
        raise ManifestError(_QUANTITY_MSG)
    num, suffix = m.groups()
    try:
        base = Fraction(num)
    except ValueError:
        raise ManifestError(_QUANTITY_MSG) from None
    text = text.strip()
    if suffix in _BINARY:
        return Quantity(_bounded(base * 1024 ** _BINARY[suffix]), "binary")
    if suffix in _DECIMAL:
        exp = _DECIMAL[suffix]
        return Quantity(_scaled(base, exp), "decimal", _go_repr(text, num, exp, "decimal"))
    e = re.fullmatch(r"[eE]([-+]?[0-9]+)", suffix)
    if e:
        exp = int(e.group(1))
        if not -(2**31) <= exp < 2**31:  # Go parses the exponent as an int32
            raise ManifestError("unable to parse quantity's suffix")
        return Quantity(_scaled(base, exp), "exponent", _go_repr(text, num, exp, "exponent"))
    raise ManifestError(_QUANTITY_MSG)


#: ``resource.ParseQuantity`` caps magnitudes at the int64 maximum ...
_MAX_QUANTITY = Fraction(2**63 - 1)
#: ... and rounds non-zero magnitudes below one nano up to ``1n``.
_NANO = Fraction(1, 10**9)


def _bounded(v: Fraction) -> Fraction:
    """Apply the API server's cap (2**63 - 1) and round-up-to-nano to ``v``."""
    sign = -1 if v < 0 else 1
    mag = abs(v)
    if mag > _MAX_QUANTITY:
        mag = _MAX_QUANTITY
    elif mag and (mag * 10**9).denominator != 1:
        mag = Fraction(-(-mag.numerator * 10**9 // mag.denominator), 10**9)
    return sign * mag


def _scaled(base: Fraction, exp: int) -> Fraction:
    """``base * 10**exp`` bounded like the API server, without computing huge powers."""
    if base == 0:
        return Fraction(0)
    magnitude = len(str(abs(base.numerator))) - len(str(base.denominator))  # ~log10 |base|
    if magnitude + exp > 20:
        return _MAX_QUANTITY if base > 0 else -_MAX_QUANTITY
    if magnitude + exp < -20:
        return _NANO if base > 0 else -_NANO
    return _bounded(base * Fraction(10) ** exp)


def format_quantity(q: Quantity) -> str:
    """Canonical text of ``q`` (like ``resource.Quantity.String()``)."""
    v = q.value
    sign = "-" if v < 0 else ""
    v = abs(v)
    if q.fmt == "binary" and v.denominator == 1 and v >= 1024:
        n = v.numerator
        for suffix, k in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
            if n % (1024**k) == 0:
                return f"{sign}{n // 1024**k}{suffix}"
    for exp in (18, 15, 12, 9, 6, 3, 0, -3, -6, -9):
        scaled = v / Fraction(10) ** exp
        if scaled.denominator == 1 and (scaled.numerator % 1000 != 0 or exp == 18 or v == 0):
            if v == 0:
                return "0"
            if q.fmt == "exponent":
                return f"{sign}{scaled.numerator}" + (f"e{exp}" if exp else "")
            return f"{sign}{scaled.numerator}{_DEC_SUFFIX[exp]}"
    nano = -(-v * 10**9 // 1)  # round up to nano like the API server
    return f"{sign}{nano}n"


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """One container as the device manager sees it."""

    name: str
    kind: ContainerKind
    limits: dict[str, int]  # extended resources only, validated integers


@dataclass(frozen=True, slots=True)
class PodSpec:
    """A validated pod: identity and containers in admission order (init first)."""

    name: str
    namespace: str
    uid: str
    containers: tuple[ContainerSpec, ...]


#: Most nodes a manifest may expand to through YAML aliases (a "billion laughs" document
#: of a few hundred bytes would otherwise expand into gigabytes when sent on).
MAX_EXPANDED_NODES = 1_000_000


def _check_aliasing(docs: list[Any]) -> None:
    """Refuse documents whose aliases expand too far, or refer to themselves."""
    sizes: dict[int, int] = {}
    busy: set[int] = set()

    def size(x: Any) -> int:
        if not isinstance(x, dict | list):
            return 1
        k = id(x)
        known = sizes.get(k)
        if known is not None:
            return known
        if k in busy:
            raise ManifestError("cannot parse manifest: document contains recursive aliasing")
        busy.add(k)
        items = list(x.keys()) + list(x.values()) if isinstance(x, dict) else x
        n = 1
        for item in items:
            n += size(item)
            if n > MAX_EXPANDED_NODES:
                raise ManifestError(
                    "cannot parse manifest: document contains excessive aliasing "
                    f"(expands to more than {MAX_EXPANDED_NODES:,} nodes)"
                )
        busy.discard(k)
        sizes[k] = n
        return n

    size(docs)  # the documents' list counts as one node more; the limit covers them all


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(x.strip() for x in text[:4])[:300] if text else type(exc).__name__


def decode_manifest(raw: bytes) -> str:
    """A manifest file's text; ``ManifestError`` if it is not UTF-8 (as the API server wants)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 1].hex()
        raise ManifestError(
            f"manifest is not valid UTF-8: byte 0x{bad} at offset {exc.start}"
        ) from None


def load_manifests(text: str) -> list[dict[str, Any]]:
    """Every object in a YAML or JSON text (multi-document, ``kind: List`` expanded)."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except RecursionError:
        raise ManifestError("cannot parse manifest: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of thousands of digits
        raise ManifestError(f"cannot parse manifest: {_first_line(exc)}") from None
    except yaml.YAMLError as exc:
        try:
            docs = [json.loads(text)]
        except (ValueError, RecursionError):
            raise ManifestError(f"cannot parse manifest: {_first_line(exc)}") from exc
    _check_aliasing(docs)
    out: list[dict[str, Any]] = []
    for d in docs:
        if not isinstance(d, dict):
            raise ManifestError(f"manifest is not an object: {type(d).__name__}")
        if d.get("kind") == "List" and isinstance(d.get("items"), list):
            out.extend(x for x in d["items"] if isinstance(x, dict))
        else:
            out.append(d)
    if not out:
        raise ManifestError("no objects found in manifest")
    return out


def _resources(c: Mapping[str, Any], path: str, errors: list[str]) -> dict[str, int]:
    res = c.get("resources") or {}
    if not isinstance(res, Mapping):
        errors.append(f"{path}.resources: Invalid value: must be an object")
        return {}
    limits_raw = res.get("limits") or {}
    requests_raw = res.get("requests") or {}
    if not isinstance(limits_raw, Mapping) or not isinstance(requests_raw, Mapping):
        errors.append(f"{path}.resources: Invalid value: limits and requests must be maps")
        return {}
    parsed: dict[str, dict[str, Quantity]] = {"limits": {}, "requests": {}}
    for section, raw in (("limits", limits_raw), ("requests", requests_raw)):
        for key in sorted(raw, key=str):
            name = str(key)
            fld = f"{path}.resources.{section}[{name}]"
            try:
                q = parse_quantity(raw[key])
            except ManifestError as exc:
                errors.append(f"{fld}: Invalid value: {_shown(raw[key])}: {exc}")
                continue
            parsed[section][name] = q
            if "/" not in name:
                if name not in _STANDARD and not name.startswith("hugepages-"):
                    errors.append(
                        f'{fld}: Invalid value: "{name}": '
                        "must be a standard resource for containers"
                    )
            elif "kubernetes.io/" not in name and not is_extended_resource_name(name):
                errors.append(
                    f'{fld}: Invalid value: "{name}": '
                    "doesn't follow extended resource name standard"
                )
            if q.value < 0:
                errors.append(f'{fld}: Invalid value: "{q}": must be greater than or equal to 0')
            if is_extended_resource_name(name) and q.value.denominator != 1:
                errors.append(f"{fld}: Invalid value: {q.go_repr or q}: must be an integer")
    limits: dict[str, int] = {}
    for name, q in parsed["requests"].items():
        if _overcommit_allowed(name):
            continue
        lim = parsed["limits"].get(name)
        if lim is None:
            errors.append(
                f"{path}.resources.limits: Required value: "
                "Limit must be set for non overcommitable resources"
            )
        elif lim.value != q.value:
            # upstream reports this one on the un-keyed path (``reqPath``)
            errors.append(
                f'{path}.resources.requests: Invalid value: "{q}": '
                f"must be equal to {name} limit of {lim}"
            )
    for name, q in parsed["limits"].items():
        if is_extended_resource_name(name) and q.value.denominator == 1 and q.value >= 0:
            limits[name] = int(q.value)
    return limits


def _shown(value: Any) -> str:
    """A bad value as the error shows it: quoted, long ones cut to their first characters."""
    try:
        text = str(value)
    except ValueError:
        text = "<an integer of thousands of digits>"
    if len(text) > 40:
        text = f"{text[:32]}... ({len(text)} characters)"
    return json.dumps(text)


def _overcommit_allowed(name: str) -> bool:
    """Upstream ``IsOvercommitAllowed``: native resources other than huge pages."""
    native = "/" not in name or "kubernetes.io/" in name
    return native and not name.startswith("hugepages-")


def parse_pod(manifest: Mapping[str, Any]) -> PodSpec:
    """Validate a Pod manifest like the API server; ``ManifestError`` lists every problem."""
    kind = manifest.get("kind", "Pod")
    if kind != "Pod":
        raise ManifestError(f'only kind "Pod" is supported, got {kind!r}')
    unknown = unknown_fields(manifest)
    if unknown:  # the API server's strict decoding runs before validation
        listed = ", ".join(f'unknown field "{f}"' for f in unknown)
        raise ManifestError(
            f'Pod in version "v1" cannot be handled as a Pod: strict decoding error: {listed}'
        )
    meta = manifest.get("metadata") or {}
    spec = manifest.get("spec") or {}
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        raise ManifestError("metadata and spec must be objects")
    name = str(meta.get("name") or "")
    namespace = str(meta.get("namespace") or "default")
    errors: list[str] = []
    if not name:
        errors.append("metadata.name: Required value: name or generateName is required")
    elif not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        errors.append(f'metadata.name: Invalid value: "{name}": {_SUBDOMAIN_MSG}')
    if not _DNS_LABEL.match(namespace):
        errors.append(f'metadata.namespace: Invalid value: "{namespace}": {_LABEL_MSG}')
    containers: list[ContainerSpec] = []
    seen: set[str] = set()
    app = spec.get("containers")
    if not app:
        errors.append("spec.containers: Required value")
    for field_name in ("initContainers", "containers"):
        items = spec.get(field_name) or []
        if not isinstance(items, list):
            errors.append(f"spec.{field_name}: Invalid value: must be a list")
            continue
        for i, c in enumerate(items):
            path = f"spec.{field_name}[{i}]"
            if not isinstance(c, Mapping):
                errors.append(f"{path}: Invalid value: must be an object")
                continue
            cname = str(c.get("name") or "")
            if not cname:
                errors.append(f"{path}.name: Required value")
            elif not _DNS_LABEL.match(cname) or len(cname) > 63:
                errors.append(f'{path}.name: Invalid value: "{cname}": {_LABEL_MSG}')
            elif cname in seen:
                errors.append(f'{path}.name: Duplicate value: "{cname}"')
            seen.add(cname)
            image = c.get("image")
            if not isinstance(image, str) or not image.strip():
                errors.append(f"{path}.image: Required value")
            kind_c: ContainerKind = "app"
            if field_name == "initContainers":
                policy = c.get("restartPolicy")
                if policy is not None and policy != "Always":
                    errors.append(
                        f'{path}.restartPolicy: Unsupported value: "{policy}": '
                        'supported values: "Always"'
                    )
                kind_c = "sidecar" if policy == "Always" else "init"
            elif c.get("restartPolicy") is not None:
                errors.append(
                    f"{path}.restartPolicy: Forbidden: may not be set for non-init containers"
                )
            limits = _resources(c, path, errors)
            containers.append(ContainerSpec(cname, kind_c, limits))
    if errors:
        body = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
        raise ManifestError(f'Pod "{name}" is invalid: {body}')
    # The API server assigns a fresh UID on create and ignores one in the manifest (e.g. a
    # manifest saved with ``kubectl get -o yaml``); two pods must never share allocations.
    return PodSpec(name, namespace, str(uuid.uuid4()), tuple(containers))
