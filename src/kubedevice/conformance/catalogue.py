"""The catalogue of conformance cases: id, MUST/SHOULD level, title and contract section.

Data only; :mod:`kubedevice.conformance.runner` decides how each case is observed and
``docs/conformance.md`` describes the same list for people.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

__all__ = ["CASES", "CASES_BY_ID", "Case", "Level"]


class Level(enum.Enum):
    """How binding a case is: MUST breaks real nodes, SHOULD is best practice."""

    MUST = "MUST"
    SHOULD = "SHOULD"
    #: Reported, never judged (the DRA kit's cost figures): it never fails a run.
    INFO = "INFO"


@dataclass(frozen=True)
class Case:
    """One conformance rule the kit checks."""

    id: str
    level: Level
    title: str
    section: str
    per_resource: bool = True


CASES: Final[tuple[Case, ...]] = (
    Case(
        "serves-before-register",
        Level.MUST,
        "the plugin socket answers before Register is sent",
        "contract.md#registration; common mistake 1",
    ),
    Case(
        "registration-valid",
        Level.MUST,
        "Register: version v1beta1, endpoint a bare socket name in the dir, valid resource name",
        "contract.md#constants, #resource-names, #registration; common mistakes 5 and 12",
    ),
    Case(
        "first-list-within-5s",
        Level.MUST,
        "the first ListAndWatch message arrives within 5 s of registration",
        "contract.md#listandwatch; common mistake 4",
    ),
    Case(
        "device-list-valid",
        Level.MUST,
        "device IDs are unique, non-empty, at most 63 printable characters; health is "
        "exactly Healthy or Unhealthy",
        "contract.md#device-plugin-messages (Device), #listandwatch; common mistake 7",
    ),
    Case(
        "options-honest",
        Level.MUST,
        "advertised optional RPCs answer; Register options equal GetDevicePluginOptions",
        "contract.md#registration (options), #allocation; common mistakes 2 and 3",
    ),
    Case(
        "allocate-healthy",
        Level.MUST,
        "Allocate of healthy devices succeeds with exactly one well-formed container response",
        "contract.md#device-plugin-messages (AllocateResponse), #allocation step 5; "
        "common mistake 13",
    ),
    Case(
        "allocate-unknown-refused",
        Level.SHOULD,
        "Allocate of an ID the plugin never advertised is refused with an error",
        "contract.md#allocation (the kubelet never sends one; plugins should still validate)",
    ),
    Case(
        "allocate-unhealthy-refused",
        Level.SHOULD,
        "Allocate of an unhealthy device is refused with an error",
        "contract.md#listandwatch, #allocation",
    ),
    Case(
        "preferred-allocation",
        Level.SHOULD,
        "GetPreferredAllocation keeps must-include IDs, answers allocation_size IDs, "
        "only offered ones, and logs no error meanwhile (a failed hook hidden by a fallback)",
        "contract.md#allocation step 3; common mistakes 16 and 17",
    ),
    Case(
        "survives-stream-kill",
        Level.MUST,
        "after the kubelet drops ListAndWatch the process stays up and keeps serving",
        "contract.md#stream-end; common mistakes 8 and 10",
    ),
    Case(
        "recovers-after-stream-kill",
        Level.SHOULD,
        "after the kubelet drops ListAndWatch the plugin re-registers and allocatable returns",
        "contract.md#stream-end; common mistake 9",
    ),
    Case(
        "reregister-within-30s",
        Level.MUST,
        "after a kubelet restart (sockets wiped) the plugin registers again within 30 s",
        "contract.md#kubelet-start-up step 3, #stream-end; common mistake 9",
    ),
    Case(
        "reregister-within-1s",
        Level.SHOULD,
        "after a kubelet restart the plugin registers again within 1 s",
        "contract.md#stream-end (watch the directory, do not poll)",
    ),
    Case(
        "sigterm-clean-exit",
        Level.SHOULD,
        "SIGTERM: exit code 0 within 5 s, the plugin's sockets are removed, and nothing it "
        "started is left running, in its session or out of it (leftovers are killed)",
        "contract.md#stream-end (a stale socket confuses the next instance)",
        per_resource=False,
    ),
)

CASES_BY_ID: Final = {case.id: case for case in CASES}
