"""Schedulers: the one interface is `submit(request)`, `inflight()`, `stop()`."""
