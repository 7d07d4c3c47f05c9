"""A DRA driver's side of the kubelet: its sockets and the services served on them.

Registration with the plugin watcher (:mod:`.registration`), the DRA claim services v1 and
v1beta1 (:mod:`.service`, checked by :mod:`.rules`, observed by :mod:`.observed`), device
health (:mod:`.health`), the Unix-socket gRPC server (:mod:`.sockets`), the probes and
metrics endpoint (:mod:`.metrics`) and :class:`~.server.DriverServer`, which starts them in
order (:mod:`.settings` holds every path it derives).
"""
