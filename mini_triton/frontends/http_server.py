"""The KServe v2 HTTP/REST front end on aiohttp: routing and status mapping only."""

from __future__ import annotations

import base64
import binascii
import functools

from aiohttp import web

from ..config.json_format import config_to_json
from ..core.datatypes import from_name
from ..core.errors import Code, TritonError, invalid_arg, unsupported
from ..core.validate import config_datatype
from ..service import CUDA_SHM_UNAVAILABLE, InferenceService
from . import http_codec
from .errors import http_status
from .restrictions import Restriction, http_refusal

DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024  # tritonserver's --http-max-input-size default

_JSON = "application/json"
_BINARY = "application/octet-stream"


def json_response(document, status: int = 200) -> web.Response:
    return web.Response(body=http_codec.dumps(document), status=status, content_type=_JSON)


def error_response(error: TritonError) -> web.Response:
    return web.Response(body=http_codec.encode_error(error), status=http_status(error.code),
                        content_type=_JSON)


def handles_errors(handler):
    """Turn a TritonError raised by a handler into Triton's JSON error response."""

    @functools.wraps(handler)
    async def wrapper(self, request: web.Request) -> web.Response:
        try:
            return await handler(self, request)
        except TritonError as error:
            return error_response(error)

    return wrapper


def _model_and_version(request: web.Request) -> tuple[str, str]:
    return request.match_info["model"], request.match_info.get("version", "")


class HttpFrontend:
    def __init__(self, service: InferenceService, max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
                 restricted: dict[str, Restriction] | None = None):
        self.service = service
        self.restricted = restricted or {}
        self.app = web.Application(client_max_size=max_input_size)
        self.app.add_routes([method(path, self._guard(group, handler))
                             for group, method, path, handler in self._routes()])

    def _routes(self) -> list[tuple]:
        """(API group, method, path, handler) for every endpoint."""
        get, post = web.get, web.post
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
            ("model-repository", post, "/v2/repository/models/{model}/load", self.load_model),
            ("model-repository", post, "/v2/repository/models/{model}/unload",
             self.unload_model),
            ("shared-memory", get, system + "/status", self.shm_status),
            ("shared-memory", get, system + "/region/{region}/status", self.shm_status),
            ("shared-memory", post, system + "/region/{region}/register", self.shm_register),
            ("shared-memory", post, system + "/region/{region}/unregister", self.shm_unregister),
            ("shared-memory", post, system + "/unregister", self.shm_unregister),
            ("shared-memory", get, cuda + "/status", self.cuda_shm_status),
            ("shared-memory", get, cuda + "/region/{region}/status", self.cuda_shm_status),
            ("shared-memory", post, cuda + "/region/{region}/register", self.cuda_shm_register),
            ("shared-memory", post, cuda + "/region/{region}/unregister", self.empty_ok),
            ("shared-memory", post, cuda + "/unregister", self.empty_ok),
        ]
        return routes

    def _guard(self, group: str, handler):
        """The handler itself, or one that first checks the group's required header."""
        restriction = self.restricted.get(group)
        if restriction is None:
            return handler

        async def guarded(request: web.Request) -> web.Response:
            if request.headers.get(restriction.header) != restriction.value:
                return web.Response(body=http_codec.dumps({"error": http_refusal(restriction)}),
                                    status=403, content_type=_JSON)
            return await handler(request)

        return guarded

    # --- health and metadata ---

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.service.live() else 400)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.service.ready() else 400)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return json_response(self.service.server_metadata())

    async def model_ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.service.model_ready(*_model_and_version(request))
                            else 400)

    @handles_errors
    async def model_metadata(self, request: web.Request) -> web.Response:
        return json_response(self.service.model_metadata(*_model_and_version(request)))

    @handles_errors
    async def model_config(self, request: web.Request) -> web.Response:
        config = self.service.model_config(*_model_and_version(request))
        return json_response(config_to_json(config, including_defaults=True))

    @handles_errors
    async def statistics(self, request: web.Request) -> web.Response:
        name, version = request.match_info.get("model", ""), request.match_info.get("version", "")
        return json_response({"model_stats": self.service.model_statistics(name, version)})

    # --- model repository extension ---

    @handles_errors
    async def repository_index(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise invalid_arg("'ready' must be a boolean")
        return json_response(self.service.repository_index(ready))

    @handles_errors
    async def load_model(self, request: web.Request) -> web.Response:
        parameters = (await _json_body(request)).get("parameters", {})
        if not isinstance(parameters, dict):
            raise invalid_arg("'parameters' must be a JSON object")
        config = parameters.get("config")
        if config is not None and not isinstance(config, str):
            raise invalid_arg("the 'config' parameter must be a string holding JSON")
        files = {key: _base64(key, value) for key, value in parameters.items()
                 if key.startswith("file:")}
        await self.service.load_model(request.match_info["model"], config, files or None)
        return web.Response(status=200)

    @handles_errors
    async def unload_model(self, request: web.Request) -> web.Response:
        parameters = (await _json_body(request)).get("parameters", {})
        dependents = parameters.get("unload_dependents", False) if isinstance(parameters, dict) \
            else False
        await self.service.unload_model(request.match_info["model"], bool(dependents))
        return web.Response(status=200)

    # --- trace and logging extensions ---

    @handles_errors
    async def trace_setting(self, request: web.Request) -> web.Response:
        changes = await _json_body(request) if request.method == "POST" else None
        return json_response(self.service.trace_settings(request.match_info.get("model", ""),
                                                         changes))

    @handles_errors
    async def logging_settings(self, request: web.Request) -> web.Response:
        changes = await _json_body(request) if request.method == "POST" else None
        return json_response(self.service.logging_settings(changes))

    # --- shared memory extensions ---

    @handles_errors
    async def shm_status(self, request: web.Request) -> web.Response:
        return json_response(self.service.system_shm.status(request.match_info.get("region", "")))

    @handles_errors
    async def shm_register(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        key, offset, size = body.get("key"), body.get("offset", 0), body.get("byte_size")
        if not isinstance(key, str) or not isinstance(offset, int) or not isinstance(size, int):
            raise invalid_arg("register needs 'key' (string), 'offset' and 'byte_size' "
                              "(integers)")
        self.service.system_shm.register(request.match_info["region"], key, offset, size)
        return web.Response(status=200)

    @handles_errors
    async def shm_unregister(self, request: web.Request) -> web.Response:
        self.service.system_shm.unregister(request.match_info.get("region", ""))
        return web.Response(status=200)

    @handles_errors
    async def cuda_shm_status(self, request: web.Request) -> web.Response:
        region = request.match_info.get("region", "")
        if region:
            raise TritonError(Code.NOT_FOUND,
                              f"Unable to find cuda shared memory region: '{region}'")
        return json_response([])

    @handles_errors
    async def cuda_shm_register(self, request: web.Request) -> web.Response:
        raise unsupported(CUDA_SHM_UNAVAILABLE)

    async def empty_ok(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    # --- inference ---

    @handles_errors
    async def infer(self, request: web.Request) -> web.Response:
        model, version = _model_and_version(request)
        body = await request.read()
        header = request.headers.get(http_codec.HEADER_LENGTH)
        header_length = _header_length(header)
        if header_length == 0:
            infer_request, binary_output = self._raw_request(model, version, body), True
        else:
            infer_request, binary_output = http_codec.decode_infer_request(
                model, version, body, header_length)
        response = await self.service.infer_unary(infer_request, "HTTP end point")
        chunks, json_length = http_codec.encode_infer_response(response, infer_request,
                                                               binary_output)
        return self._infer_response(request, chunks, json_length)

    def _raw_request(self, model: str, version: str, body: bytes):
        """Inference-Header-Content-Length: 0 — the body is the only input's raw data."""
        config = self.service.model_config(model, version)
        if len(config.input) != 1:
            raise invalid_arg(
                f"raw binary request body requires model '{model}' to have exactly one input")
        tensor = config.input[0]
        datatype = config_datatype(tensor.data_type)
        shape = _raw_shape(tensor, config.max_batch_size, len(body), datatype)
        return http_codec.decode_raw_request(model, version, body, tensor.name, datatype, shape)

    @staticmethod
    def _infer_response(request: web.Request, chunks: list, json_length: int | None):
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        headers = {}
        if json_length is not None:
            headers[http_codec.HEADER_LENGTH] = str(json_length)
        response = web.Response(body=body, headers=headers,
                                content_type=_JSON if json_length is None else _BINARY)
        if "Accept-Encoding" in request.headers:
            response.enable_compression()
        return response


async def _json_body(request: web.Request) -> dict:
    body = await request.read()
    if not body:
        return {}
    try:
        document = http_codec.loads(body)
    except ValueError as error:
        raise invalid_arg(f"failed to parse the request JSON buffer: {error}") from None
    if not isinstance(document, dict):
        raise invalid_arg("the request body must be a JSON object")
    return document


def _base64(key: str, value) -> bytes:
    if not isinstance(value, str):
        raise invalid_arg(f"parameter '{key}' must hold base64-encoded file contents")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_arg(f"parameter '{key}' is not valid base64") from None


def _header_length(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise invalid_arg(f"invalid {http_codec.HEADER_LENGTH} header '{value}'") from None
    if length < 0:
        raise invalid_arg(f"invalid {http_codec.HEADER_LENGTH} header '{value}'")
    return length


def _raw_shape(tensor, max_batch_size: int, size: int, datatype: str) -> tuple[int, ...]:
    """The shape of a raw single-input body: the config's dims, with one -1 (or the
    batch dimension) taking whatever the byte count implies."""
    dims = ([-1] if max_batch_size > 0 else []) + list(tensor.dims)
    element_size = from_name(datatype).byte_size
    known = 1
    for dim in dims:
        if dim != -1:
            known *= dim
    if dims.count(-1) > 1 and max_batch_size > 0:
        dims[0] = 1
    if dims.count(-1) > 1 or element_size == 0:
        raise invalid_arg(
            f"raw binary request body cannot infer the shape of input '{tensor.name}'")
    if -1 in dims:
        if not known or size % (known * element_size):
            raise invalid_arg(
                f"raw binary request body of {size} bytes does not fit input '{tensor.name}'")
        dims[dims.index(-1)] = size // (known * element_size)
    return tuple(dims)
