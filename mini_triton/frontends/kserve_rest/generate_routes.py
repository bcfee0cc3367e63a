"""The generate extension's two endpoints on the HTTP/1.1 server:
`POST /v2/models/NAME[/versions/V]/generate` (one JSON object) and `.../generate_stream`
(server-sent events, one per response of the model).

An error before inference is a JSON error with its status. A stream's status is set
by its first response, as in Triton (an error there gives its status, with the error
as the first event); an error after that is an event `data: {"error": ...}`. A client
that goes away cancels the request: the model sees `is_cancelled()`.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ... import trace_front_end as front_end_trace
from ...core.errors import TritonError
from ...service import InferenceService
from ...trace_front_end import FrontEndStamps
from ..errors import http_status
from ..http1.exchange import Exchange, HttpReply, HttpRequest
from ..http1.limits import DEFAULT_STREAM_MAX_QUEUED_BYTES, STREAM_LIMIT_FLAG
from ..http1.offload import BodyDecoder, off_loop
from . import generate, http_codec

log = logging.getLogger("mini_triton.http")

EVENT_STREAM = "text/event-stream; charset=utf-8"
# Proxies must pass events on as they come, and nothing should cache them.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def error_reply(status: int, message: str) -> HttpReply:
    return HttpReply(status, generate.encode_error(message))


def _not_one_status(infer_request) -> int:
    """The status of /generate on a model that gave other than one response: 500, but
    200 (Triton 2.51's status, the error in the body) for a request that asked for a
    stream with `"stream": true`, as genai-perf's requests do; its client reads the body."""
    return 200 if infer_request.parameters.get("stream") is True else 500


class GenerateEndpoints:
    def __init__(self, service: InferenceService,
                 stream_limit: int = DEFAULT_STREAM_MAX_QUEUED_BYTES,
                 decoder: BodyDecoder | None = None):
        self.service = service
        self.stream_limit = stream_limit  # responses waiting for the client, in bytes
        self.decoder = decoder or BodyDecoder()  # a large body is decoded off the loop

    def generate(self, request: HttpRequest, exchange: Exchange) -> None:
        if self.service.tracer.sampling:  # the plain path's only question about traces
            self._generate_stamped(request, exchange)
            return
        exchange.run(self._generate, request)

    def _generate_stamped(self, request: HttpRequest, exchange: Exchange) -> None:
        """`generate` while some trace level is on: a traced request carries Triton's
        HTTP front-end timestamps, as an inference does (docs/observability.md)."""
        stamps = FrontEndStamps(front_end_trace.HTTP, *exchange.protocol.received_ns(request))
        start = self._stamped_start(stamps)

        async def answer(request: HttpRequest) -> None:
            stamps.timed(exchange.answer)(await self._generate(request, start))

        exchange.run(answer, request)

    def generate_stream(self, request: HttpRequest, exchange: Exchange) -> None:
        if self.service.tracer.sampling:  # the plain path's only question about traces
            self._generate_stream_stamped(request, exchange)
            return
        exchange.run(lambda r: self._generate_stream(r, exchange), request)

    def _generate_stream_stamped(self, request: HttpRequest, exchange: Exchange) -> None:
        """`generate_stream` while some trace level is on: a traced request carries
        Triton's HTTP front-end timestamps, INFER_RESPONSE_COMPLETE and HTTP_SEND_* for
        each event (docs/observability.md). Its trace is written once its stream ends."""
        stamps = FrontEndStamps(front_end_trace.HTTP_STREAM, *exchange.protocol.received_ns(request))
        start = self._stamped_start(stamps)
        sent = 0

        def timed(send):
            async def stamped(event: bytes) -> bool:
                nonlocal sent
                began = time.monotonic_ns()
                try:
                    return await send(event)
                finally:
                    sent += 1
                    stamps.reply_written(began, time.monotonic_ns())
            return stamped
        timed.empty_final_reached = stamps.empty_final_reached

        async def answer(request: HttpRequest):
            try:
                return await self._generate_stream(request, exchange, start, timed)
            finally:  # its events are all written, or will not be (the client left)
                if stamps.trace is not None:
                    stamps.replies_counted(sent)

        exchange.run(answer, request)

    async def _start(self, request: HttpRequest):
        """Decode the request and start the inference: (request, stream)."""
        infer_request = await self._decoded(request)
        return infer_request, await self.service.start_stream(
            infer_request, self.stream_limit, STREAM_LIMIT_FLAG)

    async def _decoded(self, request: HttpRequest):
        """Look the model up (an unknown model is 404 whatever the body), then decode
        the body against its inputs (off the loop when it is large)."""
        model, version = request.params["model"], request.params.get("version", "")
        config = await self.service.ask("model_config", model, version)
        return await self.decoder.decode(request.body, _decode_body, model, version,
                                         config, request.body)

    def _stamped_start(self, stamps: FrontEndStamps):
        """`_start` for a request stamped by the front end: the service samples it as it
        starts. tritonserver samples a generate request before decoding it, and writes
        the trace of one refused after that (its body, or the core's checks) with the
        stamps of its receipt alone: a request refused for a model that is there, before
        the service sampled it, leaves such a trace (Tracer.refused)."""
        tracer = self.service.tracer

        async def start(request: HttpRequest):
            try:
                infer_request = await self._decoded(request)
                with tracer.receiving(stamps):
                    return infer_request, await self.service.start_stream(
                        infer_request, self.stream_limit, STREAM_LIMIT_FLAG)
            except TritonError:
                if stamps.trace is None:
                    await self._refused(request, stamps)
                raise
        return start

    async def _refused(self, request: HttpRequest, stamps: FrontEndStamps) -> None:
        model = request.params["model"]
        try:
            await self.service.ask("model_config", model, request.params.get("version", ""))
        except TritonError:  # Triton samples only a request for a model it serves
            return
        self.service.tracer.refused(model, stamps.received)

    async def _generate(self, request: HttpRequest, start=None) -> HttpReply:
        """One response, or Triton's error for a model that gives another number of
        them; a second response cancels the rest of the work. `start`: what starts the
        inference, if not `_start`."""
        try:
            infer_request, stream = await (start or self._start)(request)
        except TritonError as error:
            return error_reply(http_status(error.code), error.message)
        first = None
        try:
            async for response in stream:
                if response.empty:
                    continue
                if first is not None:
                    self.service.cancel(infer_request)
                    return error_reply(_not_one_status(infer_request), generate.EXACTLY_ONE)
                first = response
        except asyncio.CancelledError:
            self.service.cancel(infer_request)
            raise
        if first is None:
            return error_reply(_not_one_status(infer_request), generate.EXACTLY_ONE)
        if first.error is not None:
            return error_reply(http_status(first.error.code), first.error.message)
        body = _encoded(first)
        if body is None:  # an output too long to write here
            body = await off_loop(_encoded_in_steps, first)
        return HttpReply(200, body, compressible=True)

    async def _generate_stream(self, request: HttpRequest, exchange: Exchange,
                               start=None, timed=None):
        """`start`: what starts the inference, if not `_start`; `timed`: what stamps
        the sending of the events (a traced request's), and the empty final response
        (`timed.empty_final_reached`)."""
        try:
            infer_request, stream = await (start or self._start)(request)
        except TritonError as error:
            return error_reply(http_status(error.code), error.message)
        body = None
        try:
            async for response in stream:
                if response.empty:
                    if timed is not None:  # no event, but Triton stamps it
                        timed.empty_final_reached()
                    continue
                if body is None:
                    status = 200 if response.error is None else http_status(response.error.code)
                    body = exchange.begin_stream(status, EVENT_STREAM, STREAM_HEADERS)
                    send = body.send if timed is None else timed(body.send)
                data = _encoded(response)
                event = generate.event(data) if data is not None \
                    else await off_loop(_event_in_steps, response)  # an output too long here
                if not await send(event):
                    self.service.cancel(infer_request)  # the client is gone
                    break
        except asyncio.CancelledError:
            self.service.cancel(infer_request)
            raise
        if body is None:  # no response at all: an empty stream
            body = exchange.begin_stream(200, EVENT_STREAM, STREAM_HEADERS)
        body.end()
        return None


def _decode_body(model: str, version: str, config, body: bytes):
    """The generate request `body` as an InferenceRequest of `model`, whose config says
    what its inputs are."""
    document = generate.parse_body(body)
    specs = generate.input_specs(config)
    generate.refuse_repeated_inputs(body, document, specs)
    return generate.decode_request(model, version, document, specs)


def _encoded(response) -> bytes | None:
    """A response as its generate JSON object, or its error object; None when an output
    is too long to write on the event loop (_encoded_in_steps writes it elsewhere)."""
    if response.error is not None:
        return generate.encode_error(response.error.message)
    try:
        return generate.encode_response(response)
    except http_codec.LongOutputs:
        return None
    except TritonError as error:
        return generate.encode_error(error.message)
    except Exception as error:  # a bug here must not take the stream down silently
        log.exception("cannot encode a generate response of model '%s'", response.model_name)
        return generate.encode_error(f"internal error: {error}")


def _encoded_in_steps(response) -> list[bytes]:
    """_encoded for a response with long outputs, in pieces (on http1/offload.py's thread)."""
    try:
        return generate.encode_response_in_steps(response)
    except TritonError as error:
        return [generate.encode_error(error.message)]
    except Exception as error:  # a bug here must not take the stream down silently
        log.exception("cannot encode a generate response of model '%s'", response.model_name)
        return [generate.encode_error(f"internal error: {error}")]


def _event_in_steps(response) -> bytes:
    """One event of generate_stream for a response with long outputs: its pieces are
    joined here, on http1/offload.py's thread (an event is written as one chunk)."""
    return generate.event(b"".join(_encoded_in_steps(response)))
