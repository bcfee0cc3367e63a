"""The KServe v2 HTTP/REST front end: routing and status mapping only.

It runs on the lean HTTP/1.1 server in `../http1/`; the generate extension
(`generate_routes.py`) and the OpenAI-compatible routes (`../openai/routes.py`) share its
router, limits and restrictions.
"""

from __future__ import annotations

import base64
import binascii
import functools
from functools import partial
import logging
from dataclasses import dataclass
from typing import Callable

from ... import trace_front_end as front_end_trace
from ...config.json_format import config_to_json
from ...core import validate
from ...core.errors import TritonError, invalid_arg
from ...service import InferenceService
from ...trace_front_end import FrontEndStamps
from ..errors import http_status
from ..header_forward import forward_headers
from ..http1.limits import DEFAULT_STREAM_MAX_QUEUED_BYTES
from ..http1.offload import DEFAULT_JSON_OFFLOAD_SIZE, BodyDecoder, off_loop
from ..http1.protocol import Exchange, HttpReply, HttpRequest, Router
from ..openai.routes import OpenAIRoutes
from ..restrictions import Restriction, http_refusal
from . import http_codec, http_parameters
from .generate_routes import GenerateEndpoints

log = logging.getLogger("mini_triton.http")

DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024  # tritonserver's --http-max-input-size default

_JSON = "application/json"
_BINARY = "application/octet-stream"
_OK = HttpReply()
_NOT_READY = HttpReply(status=400)


def json_reply(document, status: int = 200) -> HttpReply:
    return HttpReply(status, http_codec.dumps(document))


def error_reply(status: int, message: str) -> HttpReply:
    return HttpReply(status, http_codec.dumps({"error": message}))


def handles_errors(handler):
    """Turn a TritonError raised by a handler into Triton's JSON error reply."""

    @functools.wraps(handler)
    async def wrapper(self, request: HttpRequest) -> HttpReply:
        try:
            return await handler(self, request)
        except TritonError as error:
            return error_reply(http_status(error.code), error.message)

    return wrapper


def _model_and_version(request: HttpRequest) -> tuple[str, str]:
    return request.params["model"], request.params.get("version", "")


class HttpFrontend:
    def __init__(self, service: InferenceService,
                 restricted: dict[str, Restriction] | None = None, openai: bool = True,
                 header_pattern=None, stream_limit: int = DEFAULT_STREAM_MAX_QUEUED_BYTES,
                 json_offload_size: int = DEFAULT_JSON_OFFLOAD_SIZE):
        self.service = service
        self.restricted = restricted or {}
        self.header_pattern = header_pattern  # --http-header-forward-pattern, compiled
        self.router = Router(lambda message: error_reply(404, message))
        # JSON bodies of at least json_offload_size bytes are decoded off the loop.
        self.decoder = BodyDecoder(json_offload_size)
        self.offload_size = json_offload_size  # the decoder's, looked up once per request
        self.generate = GenerateEndpoints(service, stream_limit, self.decoder)
        # Handlers that take (request, exchange) and answer through the exchange.
        self._starters = {self.infer, self.generate.generate, self.generate.generate_stream}
        for group, method, path, handler in self._routes():
            self.router.add(method, path, self._guard(group, handler))
        if openai:
            routes = OpenAIRoutes(service, stream_limit, self.decoder)
            for group, method, path, handler in routes.routes():
                self._starters.add(handler)
                self.router.add(method, path, self._guard(group, handler, routes.refusal))

    def handle(self, request: HttpRequest, exchange: Exchange) -> None:
        """The connection's App: route, then answer now or from a task."""
        handler, params, refusal = self.router.resolve(request.method, request.path)
        if handler is None:
            exchange.answer(refusal)
            return
        request.params = params
        handler(request, exchange)

    def _routes(self) -> list[tuple]:
        """(API group, method, path, handler) for every endpoint."""
        get, post = "GET", "POST"
        model = "/v2/models/{model}"
        routes = [
            ("health", get, "/v2/health/live", self.live),
            ("health", get, "/v2/health/ready", self.ready),
            ("metadata", get, "/v2", self.server_metadata),
            ("statistics", get, "/v2/models/stats", self.statistics),
        ]
        for prefix in (model, model + "/versions/{version}"):
            routes += [
                ("metadata", get, prefix, self.model_metadata),
                ("health", get, prefix + "/ready", self.model_ready),
                ("model-config", get, prefix + "/config", self.model_config),
                ("inference", post, prefix + "/infer", self.infer),
                ("inference", post, prefix + "/generate", self.generate.generate),
                ("inference", post, prefix + "/generate_stream", self.generate.generate_stream),
                ("statistics", get, prefix + "/stats", self.statistics),
            ]
        routes += [
            ("trace", get, "/v2/trace/setting", self.trace_setting),
            ("trace", post, "/v2/trace/setting", self.trace_setting),
            ("trace", get, model + "/trace/setting", self.trace_setting),
            ("trace", post, model + "/trace/setting", self.trace_setting),
            ("logging", get, "/v2/logging", self.logging_settings),
            ("logging", post, "/v2/logging", self.logging_settings),
        ]
        system, cuda = "/v2/systemsharedmemory", "/v2/cudasharedmemory"
        routes += [
            ("model-repository", post, "/v2/repository/index", self.repository_index),
            ("model-repository", post, "/v2/repository/{repository}/index",
             self.named_repository),
            ("model-repository", post, "/v2/repository/{repository}/models/{model}/load",
             self.named_repository),
            ("model-repository", post, "/v2/repository/{repository}/models/{model}/unload",
             self.named_repository),
            ("model-repository", post, "/v2/repository/models/{model}/load", self.load_model),
            ("model-repository", post, "/v2/repository/models/{model}/unload",
             self.unload_model),
            ("shared-memory", get, system + "/status", self.shm_status),
            ("shared-memory", get, system + "/region/{region}/status", self.shm_status),
            ("shared-memory", post, system + "/region/{region}/register", self.shm_register),
            ("shared-memory", post, system + "/register", self.shm_register),  # no name
            ("shared-memory", post, system + "/region/{region}/unregister", self.shm_unregister),
            ("shared-memory", post, system + "/unregister", self.shm_unregister),
            ("shared-memory", get, cuda + "/status", self.cuda_shm_status),
            ("shared-memory", get, cuda + "/region/{region}/status", self.cuda_shm_status),
            ("shared-memory", post, cuda + "/region/{region}/register", self.cuda_shm_register),
            ("shared-memory", post, cuda + "/register", self.cuda_shm_register),  # no name
            ("shared-memory", post, cuda + "/region/{region}/unregister",
             self.cuda_shm_unregister),
            ("shared-memory", post, cuda + "/unregister", self.cuda_shm_unregister),
        ]
        return routes

    def _guard(self, group: str, handler, refusal=error_reply):
        """The route's (request, exchange) callable: a coroutine handler runs in a task,
        a starter (inference) answers through the exchange itself; either first checks
        the group's required header where the API is restricted (`refusal` makes the
        403 reply)."""
        start = handler if handler in self._starters else \
            lambda request, exchange: exchange.run(handler, request)
        restriction = self.restricted.get(group)
        if restriction is None:
            return start

        def guarded(request: HttpRequest, exchange: Exchange) -> None:
            if request.headers.get(restriction.header) != restriction.value:
                exchange.answer(refusal(403, http_refusal(restriction)))
                return
            start(request, exchange)

        return guarded

    # --- health and metadata ---

    async def live(self, request: HttpRequest) -> HttpReply:
        return _OK if self.service.live() else _NOT_READY

    async def ready(self, request: HttpRequest) -> HttpReply:
        return _OK if await self.service.check_ready() else _NOT_READY

    async def server_metadata(self, request: HttpRequest) -> HttpReply:
        return json_reply(await self.service.ask("server_metadata"))

    async def model_ready(self, request: HttpRequest) -> HttpReply:
        ready = await self.service.check_model_ready(*_model_and_version(request))
        return _OK if ready else error_reply(400, "Model version not ready")  # Triton's

    @handles_errors
    async def model_metadata(self, request: HttpRequest) -> HttpReply:
        return json_reply(await self.service.ask("model_metadata",
                                                 *_model_and_version(request)))

    @handles_errors
    async def model_config(self, request: HttpRequest) -> HttpReply:
        config = await self.service.ask("model_config", *_model_and_version(request))
        return json_reply(config_to_json(config, including_defaults=True))

    @handles_errors
    async def statistics(self, request: HttpRequest) -> HttpReply:
        name, version = request.params.get("model", ""), request.params.get("version", "")
        statistics = await self.service.ask("model_statistics", name, version)
        return json_reply({"model_stats": statistics})

    # --- model repository extension ---

    @handles_errors
    async def named_repository(self, request: HttpRequest) -> HttpReply:
        self.service.check_repository_name(request.params["repository"])
        return _OK  # not reached: a named repository is refused

    async def _body_of(self, request: HttpRequest) -> dict:
        """The request's JSON object (decoded off the loop when it is large)."""
        return await self.decoder.decode(request.body, _json_body, request)

    @handles_errors
    async def repository_index(self, request: HttpRequest) -> HttpReply:
        body = await self._body_of(request)
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise invalid_arg("attempt to access JSON non-boolean as boolean")  # Triton's
        return json_reply(await self.service.ask("repository_index", ready))

    @handles_errors
    async def load_model(self, request: HttpRequest) -> HttpReply:
        config, files = await self.decoder.decode(request.body, _load_parameters, request)
        await self.service.load_model(request.params["model"], config, files or None)
        return _OK

    @handles_errors
    async def unload_model(self, request: HttpRequest) -> HttpReply:
        parameters = (await self._body_of(request)).get("parameters", {})
        if not isinstance(parameters, dict):
            parameters = {}  # Triton reads no parameters out of a non-object
        http_parameters.check_unload_parameters(parameters)
        await self.service.unload_model(request.params["model"],
                                        parameters.get("unload_dependents", False))
        return _OK

    # --- trace and logging extensions ---

    @handles_errors
    async def trace_setting(self, request: HttpRequest) -> HttpReply:
        changes = await self._body_of(request) if request.method == "POST" else None
        return json_reply(await self.service.ask("trace_settings",
                                                 request.params.get("model", ""), changes))

    @handles_errors
    async def logging_settings(self, request: HttpRequest) -> HttpReply:
        changes = http_parameters.log_setting_changes(await self._body_of(request)) \
            if request.method == "POST" else None
        return json_reply(await self.service.ask("logging_settings", changes))

    # --- shared memory extensions ---

    @handles_errors
    async def shm_status(self, request: HttpRequest) -> HttpReply:
        return json_reply(await self.service.ask("system_shm_status",
                                                 request.params.get("region", "")))

    @handles_errors
    async def shm_register(self, request: HttpRequest) -> HttpReply:
        region = request.params.get("region", "")
        self.service.system_shm.check_name(region)
        body = await self._body_of(request)
        key = http_parameters.register_field(body, "key", "string")
        offset = http_parameters.register_field(body, "offset", "uint", default=0)
        size = http_parameters.register_field(body, "byte_size", "uint")
        await self.service.ask("system_shm_register", region, key, offset, size)
        return _OK

    @handles_errors
    async def shm_unregister(self, request: HttpRequest) -> HttpReply:
        await self.service.ask("system_shm_unregister", request.params.get("region", ""))
        return _OK

    @handles_errors
    async def cuda_shm_status(self, request: HttpRequest) -> HttpReply:
        return json_reply(await self.service.ask("cuda_shm_status",
                                                 request.params.get("region", "")))

    @handles_errors
    async def cuda_shm_register(self, request: HttpRequest) -> HttpReply:
        self.service.cuda_shm.check_name(request.params.get("region", ""))
        body = await self._body_of(request)
        http_parameters.register_field(body, "raw_handle", "object")
        handle, device, size = body.get("raw_handle"), body.get("device_id", 0), \
            body.get("byte_size")
        if not isinstance(handle, dict) or not isinstance(handle.get("b64"), str) \
                or not isinstance(device, int) or not isinstance(size, int):
            raise invalid_arg("register needs 'raw_handle' ({\"b64\": ...}), 'device_id' and "
                              "'byte_size'")
        await self.service.ask("cuda_shm_register", request.params["region"], handle["b64"],
                               device, size)
        return _OK

    @handles_errors
    async def cuda_shm_unregister(self, request: HttpRequest) -> HttpReply:
        await self.service.ask("cuda_shm_unregister", request.params.get("region", ""))
        return _OK

    # --- inference ---

    def infer(self, request: HttpRequest, exchange: Exchange) -> None:
        """POST /v2/models/NAME[/versions/V]/infer: the JSON header's length comes from
        the Inference-Header-Content-Length header."""
        params = request.params
        model, version = params["model"], params.get("version", "")
        value = request.headers.get("inference-header-content-length")
        if value is None:
            # Triton's header length defaults to the body's: an empty body is a raw
            # binary request whose one input has no bytes.
            header_length = None if request.body else 0
        else:
            header_length = http_parameters.header_integer(value)  # the codec checks its range
            if header_length is None:
                error = invalid_arg(f"invalid {http_codec.HEADER_LENGTH} header '{value}'")
                exchange.spawn(self._answer_undecodable(model, version, error, V2_REPLIES,
                                                        request, exchange))
                return
        self.start_infer(request, exchange, model, version, header_length)

    def start_infer(self, request: HttpRequest, exchange: Exchange, model: str, version: str,
                    header_length: int | None, replies: "InferReplies" = None) -> None:
        """Start an inference of `model` whose body's JSON header is `header_length`
        bytes (None: all of it; 0: the body is the only input's raw data); the final
        response is encoded and written from the call that delivers it (on the loop),
        without a task in between. `replies` shapes the reply (the v2 API's, or a cloud
        front end's status codes and content types)."""
        replies = replies or V2_REPLIES
        if header_length != 0 and self.offload_size <= (  # a large JSON header: off the loop
                len(request.body) if header_length is None else header_length):
            exchange.spawn(self._start_off_loop(request, exchange, model, version,
                                                header_length, replies))
            return
        try:  # decoded inline: this runs for every request
            if header_length == 0:
                infer_request, binary_output = http_codec.decode_raw_request(
                    model, version, request.body), True
            else:
                infer_request, binary_output = http_codec.decode_infer_request(
                    model, version, request.body, header_length)
            if self.header_pattern is not None:
                forward_headers(self.header_pattern, request.headers.items(),
                                infer_request.parameters)
        except TritonError as error:
            exchange.spawn(self._answer_undecodable(model, version, error, replies, request,
                                                    exchange))
            return
        if len(request.body) >= self.offload_size and validate.has_large_bytes_inputs(
                infer_request, self.offload_size):
            exchange.spawn(self._split_then_begin(request, exchange, infer_request,
                                                  binary_output, replies))
            return
        self._begin(request, exchange, infer_request, binary_output, replies)

    async def _split_then_begin(self, request: HttpRequest, exchange: Exchange, infer_request,
                                binary_output: bool, replies: "InferReplies") -> None:
        """Start an inference whose BYTES inputs are large once they are split into their
        elements off the loop (a walk over millions of length prefixes takes seconds)."""
        await off_loop(validate.split_bytes_inputs, infer_request, self.offload_size)
        self._begin(request, exchange, infer_request, binary_output, replies)

    async def _start_off_loop(self, request: HttpRequest, exchange: Exchange, model: str,
                              version: str, header_length: int | None,
                              replies: "InferReplies") -> None:
        """start_infer for a body whose JSON header is large: decoded on the decoder's
        thread, then started as any other."""
        try:
            infer_request, binary_output = await self.decoder.decode(
                request.body, _decoded_and_split, model, version, request.body,
                header_length, self.offload_size)
            if self.header_pattern is not None:
                forward_headers(self.header_pattern, request.headers.items(),
                                infer_request.parameters)
        except TritonError as error:
            await self._answer_undecodable(model, version, error, replies, request, exchange)
            return
        self._begin(request, exchange, infer_request, binary_output, replies)

    def _begin(self, request: HttpRequest, exchange: Exchange, infer_request,
               binary_output: bool, replies: "InferReplies") -> None:
        """Start a decoded inference; its reply is written from the call that delivers
        the final response."""
        service = self.service
        if service.tracer.sampling:  # the plain path's only question about traces
            self._start_stamped(request, infer_request, exchange, binary_output, replies)
            return
        try:  # partial, not closures: fewer steps per request
            service.start_unary(infer_request, "HTTP end point",
                                partial(_answer_infer, exchange, exchange.answer,
                                        infer_request, binary_output, replies))
        except TritonError as error:
            exchange.answer(replies.error(error))
            return
        if exchange.reply is None:
            exchange.cancel = partial(service.cancel, infer_request)

    def _start_stamped(self, request: HttpRequest, infer_request, exchange: Exchange,
                       binary_output: bool, replies: "InferReplies") -> None:
        """start_infer's end while some trace level is on: a traced request carries
        Triton's HTTP front-end timestamps (docs/observability.md says what each is)."""
        service = self.service
        stamps = FrontEndStamps(front_end_trace.HTTP, *exchange.protocol.received_ns(request))
        send = stamps.timed(exchange.answer)
        answer = partial(_answer_infer, exchange, send, infer_request, binary_output, replies)
        with service.tracer.receiving(stamps):
            try:
                service.start_unary(infer_request, "HTTP end point", answer)
            except TritonError as error:
                send(replies.error(error))
                return
        if exchange.reply is None:
            exchange.cancel = partial(service.cancel, infer_request)

    async def _answer_undecodable(self, model: str, version: str, error: TritonError,
                                  replies: "InferReplies", request: HttpRequest,
                                  exchange: Exchange) -> None:
        """Answer a body that does not decode: as in Triton, the model is looked up
        first (an unknown or failed model is 404 whatever the body), then the body
        error. Only this failing path pays for the lookup (asked of the service, so it
        is awaited). Triton samples the request for a trace between the two: a traced
        one leaves a trace of its receipt."""
        try:
            await self.service.ask("model_config", model, version)
        except TritonError as lookup:
            exchange.answer(replies.error(lookup))
            return
        if self.service.tracer.sampling:
            self.service.tracer.refused(model, exchange.protocol.received_ns(request))
        exchange.answer(replies.error(error))


@dataclass(frozen=True)
class InferReplies:
    """How an inference front end answers: the reply to an error, and the headers of
    a reply whose body holds `json_length` bytes of JSON then binary outputs (None:
    JSON only), and whether it is compressed for a client that accepts it."""

    error: Callable[[TritonError], HttpReply]
    binary_headers: Callable[[int | None], tuple[str, dict[str, str]]]
    compressible: bool = True


def _v2_binary_headers(json_length: int | None) -> tuple[str, dict[str, str]]:
    if json_length is None:
        return _JSON, {}
    return _BINARY, {http_codec.HEADER_LENGTH: str(json_length)}


V2_REPLIES = InferReplies(lambda error: error_reply(http_status(error.code), error.message),
                          _v2_binary_headers)


def _answer_infer(exchange: Exchange, send: Callable[[HttpReply], None], request,
                  binary_output: bool, replies: InferReplies, response) -> None:
    """Answer (through `send`) with the HTTP reply of an inference's final response; one
    with long outputs to write as JSON is written on http1/offload.py's thread."""
    reply = _infer_reply(response, request, binary_output, replies)
    if reply is None:
        exchange.spawn(_send_written_off_loop(send, response, request, binary_output,
                                              replies))
        return
    send(reply)


def _decoded_and_split(model: str, version: str, body, header_length: int | None,
                       split_size: int):
    """decode_infer_request, and the split of its large BYTES inputs (on the worker)."""
    infer_request, binary_output = http_codec.decode_infer_request(model, version, body,
                                                                   header_length)
    validate.split_bytes_inputs(infer_request, split_size)
    return infer_request, binary_output


async def _send_written_off_loop(send: Callable[[HttpReply], None], response, request,
                                 binary_output: bool, replies: InferReplies) -> None:
    send(await off_loop(_infer_reply, response, request, binary_output, replies, True))


def _infer_reply(response, request, binary_output: bool, replies: InferReplies,
                 stepped: bool = False) -> HttpReply | None:
    """The HTTP reply of an inference's final response; None when it has long outputs
    to write as JSON and is not `stepped` (see http_codec.LongOutputs)."""
    if response.error is not None:
        return replies.error(response.error)
    try:
        chunks, json_length = http_codec.encode_infer_response(response, request,
                                                               binary_output, stepped)
    except TritonError as error:
        return replies.error(error)
    except http_codec.LongOutputs:
        return None
    except Exception as error:  # a bug here must not reach the model's scheduler
        log.exception("cannot encode the response of model '%s'", request.model_name)
        return error_reply(500, f"internal error: {error}")
    content_type, headers = replies.binary_headers(json_length)
    return HttpReply(200, chunks, content_type, headers, compressible=replies.compressible)


def _json_body(request: HttpRequest) -> dict:
    body = request.body
    if not body:
        return {}
    try:
        document = http_codec.loads_body(body)
    except ValueError as error:
        raise invalid_arg(f"failed to parse the request JSON buffer: {error}") from None
    if not isinstance(document, dict):
        raise invalid_arg("the request body must be a JSON object")
    return document


def _load_parameters(request: HttpRequest) -> tuple[str | None, dict[str, bytes]]:
    """A load request's config override and its files, decoded."""
    parameters = _json_body(request).get("parameters", {})
    if not isinstance(parameters, dict):
        raise invalid_arg("'parameters' must be a JSON object")
    http_parameters.check_load_parameters(parameters)
    files = {key: _base64(key, value) for key, value in parameters.items()
             if key.startswith("file:")}
    return parameters.get("config"), files


# Characters decoded per b64decode call (a multiple of 4): one call holds the GIL, and
# a load's files (tens of MiB) are decoded on http1/offload.py's thread.
BASE64_SLICE = 1 << 20


def _base64(key: str, value) -> bytes:
    if not isinstance(value, str):
        raise invalid_arg(f"parameter '{key}' must hold base64-encoded file contents")
    try:
        if len(value) <= BASE64_SLICE:
            return base64.b64decode(value, validate=True)
        return b"".join(base64.b64decode(value[start:start + BASE64_SLICE], validate=True)
                        for start in range(0, len(value), BASE64_SLICE))
    except (binascii.Error, ValueError):
        raise invalid_arg(f"parameter '{key}' is not valid base64") from None

