"""A DRA driver's side of the API server.

Credentials and the one HTTP client (:mod:`.credentials`, :mod:`.kube`), the node's
ResourceSlices (:mod:`.slices`), the status of prepared claims (:mod:`.status`), claims
read back into the model (:mod:`.claims`) and the DeviceClasses a driver offers
(:mod:`.classes`).
"""
