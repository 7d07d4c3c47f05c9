"""The DRA device model: plain values and the API's rules for them, with no I/O.

Devices, attributes, capacities and counters (:mod:`.types`, :mod:`.quantity`,
:mod:`.capacity`, :mod:`.counters`), the names the API accepts (:mod:`.names`), one
slice device's limits (:mod:`.validation`) and the taints an unhealthy device gets
(:mod:`.taints`). Everything else in the kit stands on this room; it imports none of them.
"""
