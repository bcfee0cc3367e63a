"""What happens when a request is answered: its statistics, the response cache, and
its trace when it was sampled (the service sets a request's `on_complete` from here)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .errors import Code
from .request import InferenceRequest, InferenceResponse
from .response_cache import ResponseCache

# Triton's failure reasons for nv_inference_request_failure.
FAILURE_REASONS = {Code.UNAVAILABLE: "REJECTED", Code.CANCELLED: "CANCELED"}


@dataclass
class CacheLookup:
    """A request's visit to the response cache: its key, the cached outputs (None: a
    miss) and how long the lookup took."""

    cache: ResponseCache
    key: bytes
    outputs: list | None
    lookup_ns: int

    def record(self, stats, response: InferenceResponse) -> None:
        """Account for the visit once the request is answered; a miss that succeeded
        leaves its outputs in the cache (the insertion counts in the miss's time)."""
        if self.outputs is not None:
            stats.record_cache(True, self.lookup_ns)
            return
        start = time.monotonic_ns()
        if response.error is None:
            self.cache.insert(self.key, response.outputs)
        stats.record_cache(False, self.lookup_ns + time.monotonic_ns() - start)


def completion_recorder(loaded, trace=None, lookup: CacheLookup | None = None):
    """What happens when a request's final response is sent: statistics, the response
    cache, and its trace when the request was sampled. A request neither traced nor
    looked up in the cache (most) gets its model version's one shared recorder, kept on
    `loaded` (the repository's LoadedVersion: its `stats`)."""
    if trace is None and lookup is None:
        plain = loaded.__dict__.get("_record_completion")
        if plain is None:
            plain = loaded.__dict__["_record_completion"] = _recorder(loaded.stats)
        return plain
    return _recorder(loaded.stats, trace, lookup)


def _recorder(stats, trace=None, lookup: CacheLookup | None = None):
    """`completion_recorder`'s function, made anew."""

    def record(request: InferenceRequest, response: InferenceResponse) -> None:
        elapsed = time.monotonic_ns() - request.arrival_ns
        if request.held_regions is not None:
            request.release_regions()
        if lookup is not None:
            lookup.record(stats, response)
        if request.stats_released:
            pass  # a decoupled request, counted when the backend released it
        elif response.error is None:
            stats.record_request(elapsed, True)
        else:
            error = response.error
            stats.record_request(elapsed, False, error.failure_reason
                                 or FAILURE_REASONS.get(error.code, "BACKEND"))
        if trace is not None:
            trace.finish(request, response)

    return record
