"""Triton's front-end timestamps of a traced request (HTTP_RECV_*, HTTP_SEND_*,
GRPC_WAITREAD_*, GRPC_SEND_*): what each front end stamps, and where tritonserver 2.51
writes those stamps among the core's in a trace (docs/observability.md, Traces).
tracing.Trace writes a request's trace through FrontEndStamps when its front end
stamped it. With front-end processes, the front end stamps a request in its process and
relays what it saw (`relay`, `relayed_record`) to the main process, whose FrontEndStamps
of the request (which holds its trace) takes it (`take_relayed`).
"""

from __future__ import annotations

import threading
import time

# The core's timestamps taken as the request is queued, and the one Triton's front ends
# stamp themselves.
QUEUED = ("REQUEST_START", "QUEUE_START")
COMPLETE = "INFER_RESPONSE_COMPLETE"


class _Relayed:
    """What `FrontEndStamps.trace` holds in a front-end process once the main process
    says it sampled the request: the trace is the main process's, the stamps go there."""

    def __repr__(self) -> str:
        return "<trace held by the main process>"


RELAYED = _Relayed()


class FrontEnd:
    """Where a front end's timestamps sit in Triton's trace: `before` the model's
    entry, or after the core's timestamps, joined by INFER_RESPONSE_COMPLETE where
    the front end keeps that one with its own (`keeps_complete`), or stamps one with
    each reply (`complete_each`)."""

    def __init__(self, received: tuple[str, str], sent: tuple[str, str],
                 before: bool, keeps_complete: bool = False, after_release: bool = True,
                 complete_each: bool = False):
        self.received, self.sent = received, sent
        self.before, self.keeps_complete = before, keeps_complete
        # an INFER_RESPONSE_COMPLETE before each reply's SEND_* (instead of the first
        # response's alone)
        self.complete_each = complete_each
        # (gRPC) whether its stamps always follow the core's: else they come before the
        # release's timestamps when the replies were written first
        self.after_release = after_release


# tritonserver 2.51: its HTTP server stamps a request as its trace starts (received)
# and as its reply is sent; its gRPC server keeps its stamps in the call's state and
# hands them to the trace when the call ends.
HTTP = FrontEnd(("HTTP_RECV_START", "HTTP_RECV_END"), ("HTTP_SEND_START", "HTTP_SEND_END"),
                before=True)
GRPC = FrontEnd(("GRPC_WAITREAD_START", "GRPC_WAITREAD_END"),
                ("GRPC_SEND_START", "GRPC_SEND_END"), before=False, keeps_complete=True)
# A ModelStreamInfer request: its state is released after its last write, which for a
# decoupled model may come before the model releases the request (tritonserver 2.51's
# file then has the gRPC stamps before COMPUTE_START).
GRPC_STREAM = FrontEnd(GRPC.received, GRPC.sent, before=False, keeps_complete=True,
                       after_release=False)
# generate_stream: each response stamped INFER_RESPONSE_COMPLETE as it comes, and its
# event HTTP_SEND_* as it is written, in the order of events.
HTTP_STREAM = FrontEnd(HTTP.received, HTTP.sent, before=True, keeps_complete=True,
                       after_release=False, complete_each=True)


class FrontEndStamps:
    """What a front end saw of one request, taken only while some trace level is on:
    when it received the request's first and last bytes, when the final response
    reached it (Triton's front ends stamp INFER_RESPONSE_COMPLETE), and when it began
    and finished writing the reply (steady-clock ns). If the service traces the request
    (Tracer.sample under `Tracer.receiving`), the trace is written once both the
    request is done (`request_done`) and its reply written (`timed`), in either order,
    from either thread; a request not traced leaves the stamps unused. A request of a
    stream has any number of replies: each is stamped as written (`reply_written`), and
    the trace waits for as many as `replies_counted` says, or for its stream's end.

    In a front-end process the trace is the main process's: `relay` is called with these
    stamps once every reply is written (instead of writing a trace), and the main
    process's stamps of the request wait for that record (`take_relayed`)."""

    __slots__ = ("front_end", "received", "trace", "forget", "relay", "_lock", "_done",
                 "_complete_ns", "_sent", "_replies", "_ended", "_sent_first", "_written",
                 "_empty_ns", "_done_ns", "_replied_ns")

    def __init__(self, front_end: FrontEnd, first_byte_ns: int, last_byte_ns: int):
        self.front_end = front_end
        self.received = (first_byte_ns, last_byte_ns)
        self.trace = None  # the tracing.Trace the request gets, if sampled (RELAYED
        #                    in a front-end process: the main process holds it)
        self.forget = None  # called with these stamps once their trace is written
        self.relay = None  # (a front-end process) called with them once all is written
        self._lock = threading.Lock()
        self._done: tuple | None = None
        self._complete_ns: int | None = None  # the first response reached the front end
        self._sent: list[tuple[int, int, int]] = []  # each reply: (reached, start, end)
        self._replies: int | None = None  # how many replies it has, once known
        self._ended = False  # its stream ended: no more replies will be written
        self._sent_first = False  # the replies were written before the request was done
        self._written = False
        self._empty_ns: int | None = None  # (generate_stream) the empty final response
        # When the request was done, and when its replies were all written (or its
        # stream ended): which came first orders the trace (`_sent_first`).
        self._done_ns: int | None = None
        self._replied_ns: int | None = None

    def timed(self, write):
        """`write`, the call that writes the reply of the final response, stamped: the
        response complete and SEND_START before it, SEND_END once it returns."""
        def stamped(*args) -> None:
            start = time.monotonic_ns()
            try:
                write(*args)
            finally:
                self._reply_written(start, time.monotonic_ns())
        return stamped

    def _reply_written(self, start_ns: int, end_ns: int) -> None:
        """The one reply of a request with one response: the response reached the front
        end as its writing began."""
        with self._lock:
            self._complete_ns = start_ns
            self._replies = 1
        self.reply_written(start_ns, end_ns)

    # A request with any number of replies (a stream's): the front end says when each
    # response reaches it, when each reply was written, and how many there are.

    def response_reached(self) -> None:
        """A response of the request reached the front end (the first one counts)."""
        if self._complete_ns is None:
            self._complete_ns = time.monotonic_ns()

    def reply_written(self, start_ns: int, end_ns: int) -> None:
        """A reply was written; its response reached the front end as it began."""
        with self._lock:
            self._sent.append((start_ns, start_ns, end_ns))
            ready = self._settled()
        if ready:
            self._write()

    def empty_final_reached(self) -> None:
        """(generate_stream) A decoupled model's empty final response reached the front
        end: no event goes out for it, but tritonserver stamps its INFER_RESPONSE_COMPLETE
        (after those of the events written)."""
        with self._lock:
            self._empty_ns = time.monotonic_ns()

    def replies_counted(self, count: int) -> None:
        """The request will have `count` replies written (its responses are all out)."""
        with self._lock:
            self._replies = count
            ready = self._settled()
        if ready:
            self._write()

    def stream_ended(self) -> None:
        """The stream of the request ended, maybe before all its replies were written:
        its trace is written with those that were."""
        with self._lock:
            self._ended = True
            ready = self._settled()
        if ready:
            self._write()

    def request_done(self, request, response, marks: list) -> None:
        """The traced request is done: its response and its core timestamps."""
        with self._lock:
            self._done = (request, response, marks)
            self._done_ns = time.monotonic_ns()
            ready = self._settled()
        if ready:
            self._write()

    # Front-end processes: the front end's stamps travel to the main process.

    def relayed_record(self) -> tuple:
        """(A front-end process) What the front end saw of the request once its replies
        are all written: the first response reached, each reply (reached, start, end),
        the empty final response reached, and when the last of them was done."""
        return self._complete_ns, self._sent, self._empty_ns, self._replied_ns

    def take_relayed(self, record: tuple) -> None:
        """(The main process) The front-end process's `relayed_record` of the request:
        its stamps are those, and no more replies will come."""
        complete_ns, sent, empty_ns, replied_ns = record
        with self._lock:
            self._complete_ns, self._empty_ns = complete_ns, empty_ns
            self._sent = [tuple(reply) for reply in sent]
            self._replied_ns = replied_ns
            self._ended = True
            ready = self._settled()
        if ready:
            self._write()

    def _settled(self) -> bool:
        """(Under the lock) whether the trace is to be written (or relayed) now: every
        reply written, the request done (where the trace is held here), and not written
        yet."""
        replied = self._ended or self._replies is not None and len(self._sent) >= self._replies
        if not replied or self._written:
            return False
        if self.relay is not None:  # the request is done in the main process
            self._replied_ns = time.monotonic_ns()
        elif self._done is None:
            self._sent_first = True
            return False
        elif self._replied_ns is not None:  # relayed: by the two processes' one clock,
            # not by when the record came
            self._sent_first = self._replied_ns < self._done_ns
        self._written = True
        return True

    def _write(self) -> None:
        if self.forget is not None:
            self.forget(self)
        if self.relay is not None:
            self.relay(self)
            return
        trace, front_end = self.trace, self.front_end
        request, response, marks = self._done
        complete_ns = self._complete_ns
        if complete_ns is not None:
            marks = [(name, complete_ns if name == COMPLETE else ns) for name, ns in marks]
        kept = []
        if front_end.keeps_complete:
            kept = [trace._stamp(name, ns) for name, ns in marks if name == COMPLETE]
            marks = [mark for mark in marks if mark[0] != COMPLETE]
        if front_end.complete_each:  # one per reply instead
            kept = []
        entries = trace._entries(request, response, marks)
        trace.record(self._placed(entries, kept))

    def _placed(self, entries: list[dict], kept: list[dict]) -> list[dict]:
        """`entries` (the model's, the core's) with the front end's stamps where
        tritonserver writes them, which follows the order of events: its front ends
        write their stamps of a reply as it goes out (HTTP) or as the call's state is
        released after its last write (gRPC), before or after the model releases the
        request (which reports the compute timestamps and REQUEST_END)."""
        trace, front_end = self.trace, self.front_end
        received = [trace._stamp(name, ns)
                    for name, ns in zip(front_end.received, self.received)]
        sent = []
        for reached, *sent_ns in self._sent:
            if front_end.complete_each:
                sent.append(trace._stamp(COMPLETE, reached))
            sent += [trace._stamp(name, ns) for name, ns in zip(front_end.sent, sent_ns)]
        if self._empty_ns is not None:
            sent.append(trace._stamp(COMPLETE, self._empty_ns))
        if front_end.before and not front_end.keeps_complete:  # HTTP, one reply
            at = len(entries)
            if self._sent_first:
                at = 1 + next((i for i, entry in enumerate(entries)
                               if _name(entry) == COMPLETE), at - 1)
            return received + entries[:at] + sent + entries[at:]
        at = _release_at(entries)
        if front_end.before:  # generate_stream: the first response came before the
            # release; its event, and the others, went out before or after it
            later = [] if self._sent_first else sent[1:]
            return received + entries[:at] + sent[:len(sent) - len(later)] \
                + entries[at:] + later
        if not self._sent_first or front_end.after_release:
            at = len(entries)
        return entries[:at] + received + kept + sent + entries[at:]


def _release_at(entries: list[dict]) -> int:
    """Where the timestamps the core reports at the request's release begin."""
    return next((i for i, entry in enumerate(entries)
                 if _name(entry) not in (None, *QUEUED)), len(entries))


def _name(entry: dict) -> str | None:
    """The name of a timestamp entry; None for the model's entry and tensors."""
    stamps = entry.get("timestamps")
    return stamps[0]["name"] if stamps else None
