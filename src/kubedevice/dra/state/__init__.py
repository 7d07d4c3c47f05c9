"""What a DRA driver keeps on the node's disk, and the locks around it.

The prepared-claim checkpoint (:mod:`.checkpoint`, saved by :mod:`.saver`), one CDI spec
per prepared claim (:mod:`.cdi`), the node's two lock files (:mod:`.lock`) and the claim
work shared by the instances of one driver during an upgrade (:mod:`.handover`). This is
the room a crash, a cut-off call or a reboot is recovered from.
"""
