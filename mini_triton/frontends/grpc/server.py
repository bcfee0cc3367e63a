"""The KServe v2 gRPC front end: the servicer (routing and status mapping only) and its
server, on our own HTTP/2 transport (native_transport.py) or on grpc.aio (grpcio_transport.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from ...core.errors import TritonError
from ...service import InferenceService
from ..accept_gate import AcceptLimits
from ..errors import grpc_status
from ..header_forward import forward_headers
from ..http2.limits import Http2Limits
from ..restrictions import GRPC_PREFIX, Restriction, grpc_refusal
from ..tls import TlsFiles, server_context
from . import (codec, infer_read, message_split, native_transport, parameter_kinds, stream_infer,
               wire)
from .grpcio_transport import (MAX_MESSAGE_SIZE, RAW_REQUESTS, SERVICE,  # noqa: F401 (theirs)
                               create_grpcio_server, server_options)

# On our transport ModelInfer reads its message itself too: its tensors as views of
# the received bytes (message_split.py), not copied twice by protobuf.
NATIVE_RAW_REQUESTS = RAW_REQUESTS | {"ModelInfer"}


def aborts_on_error(method):
    """Turn a TritonError into the call's status with Triton's message."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except TritonError as error:
            await context.abort(grpc_status(error.code), error.message)

    return wrapper


# The API group of every RPC, for restricted protocols.
RPC_GROUPS = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace", "LogSettings": "logging",
}


def _has_header(context, restriction: Restriction) -> bool:
    return stream_infer.has_metadata(context, GRPC_PREFIX + restriction.header,
                                    restriction.value)


def _guarded_unary(method, restriction: Restriction):
    async def guarded(request, context):
        if not _has_header(context, restriction):
            await context.abort(grpc.StatusCode.UNAVAILABLE, grpc_refusal(restriction))
        return await method(request, context)

    return guarded


def _guarded_begin(begin, restriction: Restriction):
    def guarded(request, context, reply):
        if not _has_header(context, restriction):
            raise native_transport.AbortError(grpc.StatusCode.UNAVAILABLE,
                                            grpc_refusal(restriction))
        return begin(request, context, reply)

    return guarded


def _guarded_stream(method, restriction: Restriction):
    async def guarded(request_iterator, context):
        if not _has_header(context, restriction):
            await context.abort(grpc.StatusCode.UNAVAILABLE, grpc_refusal(restriction))
        async for response in method(request_iterator, context):
            yield response

    return guarded


def _delayed_unary(method, seconds: float):
    """TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC, a test hook of Triton's: a call
    other than inference answers `seconds` late (its client-timeout tests use it)."""
    async def delayed(request, context):
        await asyncio.sleep(seconds)
        return await method(request, context)

    return delayed


def _delayed_begin(begin, seconds: float):
    """TRITONSERVER_DELAY_GRPC_PROCESS (milliseconds), Triton's test hook for inference:
    a ModelInfer starts `seconds` late, without holding the loop meanwhile."""
    def delayed(request, context, reply):
        cancels = []

        def start() -> None:
            try:
                cancels.append(begin(request, context, reply))
            except Exception as error:  # an AbortError included: the call ends with it
                reply(error)

        handle = asyncio.get_running_loop().call_later(seconds, start)

        def cancel() -> None:
            handle.cancel()
            for cancel_started in cancels:
                cancel_started()

        return cancel

    return delayed


def _debug_delay(name: str, unit: float) -> float:
    """A delay from Triton's debug variable `name` (a whole number of `unit` seconds;
    0 when unset or not a number, as atoi reads it)."""
    try:
        return max(0, int(os.environ.get(name, "0"))) * unit
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class GrpcOptions:
    """What the gRPC front end does on either transport, beyond HTTP/2's limits."""
    # --grpc-stream-max-queued-bytes: one ModelStreamInfer call's responses waiting for
    # its client (stream_infer.StreamOutbox); 0: no limit
    stream_max_queued_bytes: int = stream_infer.DEFAULT_STREAM_MAX_QUEUED_BYTES
    # --grpc-stream-max-requests-in-flight: one ModelStreamInfer call's requests under
    # way; past it the next is not read (0: no limit)
    stream_max_in_flight: int = stream_infer.DEFAULT_STREAM_MAX_IN_FLIGHT
    # --grpc-infer-response-compression-level: none, low, medium or high (COMPRESSION_LEVELS)
    response_compression: str = "none"
    # --grpc-message-thread-count: our transport's threads for large messages' work
    # (inflating, reading, compressing: offload.py)
    message_threads: int = native_transport.DEFAULT_MESSAGE_THREADS


# The RPCs whose responses --grpc-infer-response-compression-level compresses (Triton's
# infer handlers set the level; the others do not).
MODEL_INFER = b"/inference.GRPCInferenceService/ModelInfer"
MODEL_STREAM_INFER = b"/inference.GRPCInferenceService/ModelStreamInfer"
COMPRESSED_RPCS = (MODEL_INFER, MODEL_STREAM_INFER)


class GrpcFrontend(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, service: InferenceService,
                 restricted: dict[str, Restriction] | None = None, header_pattern=None,
                 options: GrpcOptions | None = None):
        self.service = service
        self.header_pattern = header_pattern  # --grpc-header-forward-pattern, compiled
        self.options = options or GrpcOptions()
        for name, group in RPC_GROUPS.items():
            restriction = (restricted or {}).get(group)
            if restriction is None or not hasattr(self, name):
                continue
            if hasattr(self, "begin_" + name):  # the coroutine form goes through it
                name, guard = "begin_" + name, _guarded_begin
            else:
                guard = _guarded_stream if name == "ModelStreamInfer" else _guarded_unary
            setattr(self, name, guard(getattr(self, name), restriction))
        self._add_debug_delays()

    def _add_debug_delays(self) -> None:
        """Triton's test hooks, read as its gRPC server reads them (never set in use)."""
        response = _debug_delay("TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC", 1.0)
        process = _debug_delay("TRITONSERVER_DELAY_GRPC_PROCESS", 0.001)
        for name in RPC_GROUPS if response else ():
            if name not in ("ModelInfer", "ModelStreamInfer") and hasattr(self, name):
                setattr(self, name, _delayed_unary(getattr(self, name), response))
        if process:
            self.begin_ModelInfer = _delayed_begin(self.begin_ModelInfer, process)

    # --- health and metadata ---

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=self.service.live())

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=await self.service.check_ready())

    @aborts_on_error
    async def ModelReady(self, request, context):
        version = parameter_kinds.model_version(request.version)
        return pb.ModelReadyResponse(
            ready=await self.service.check_model_ready(request.name, version))

    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(**await self.service.ask("server_metadata"))

    @aborts_on_error
    async def ModelMetadata(self, request, context):
        return codec.metadata_message(await self.service.ask(
            "model_metadata", request.name, parameter_kinds.model_version(request.version)))

    @aborts_on_error
    async def ModelConfig(self, request, context):
        return pb.ModelConfigResponse(config=await self.service.ask(
            "model_config", request.name, parameter_kinds.model_version(request.version)))

    @aborts_on_error
    async def ModelStatistics(self, request, context):
        return codec.statistics_message(await self.service.ask(
            "model_statistics", request.name, parameter_kinds.model_version(request.version)))

    # --- model repository extension ---

    @aborts_on_error
    async def RepositoryIndex(self, request, context):
        self.service.check_repository_name(request.repository_name)
        response = pb.RepositoryIndexResponse()
        for entry in await self.service.ask("repository_index", request.ready):
            response.models.add(**entry)
        return response

    @aborts_on_error
    async def RepositoryModelLoad(self, request, context):
        self.service.check_repository_name(request.repository_name)
        parameter_kinds.check_load_parameters(request.parameters)
        parameters = codec.read_parameters(request.parameters)
        config = parameters.get("config")
        files = {key: value for key, value in parameters.items() if key.startswith("file:")}
        await self.service.load_model(request.model_name, config, files or None)
        return pb.RepositoryModelLoadResponse()

    @aborts_on_error
    async def RepositoryModelUnload(self, request, context):
        self.service.check_repository_name(request.repository_name)
        parameter_kinds.check_unload_parameters(request.parameters)
        parameters = codec.read_parameters(request.parameters)
        await self.service.unload_model(request.model_name,
                                        parameters.get("unload_dependents", False))
        return pb.RepositoryModelUnloadResponse()

    # --- shared memory extensions ---

    @aborts_on_error
    async def SystemSharedMemoryStatus(self, request, context):
        response = pb.SystemSharedMemoryStatusResponse()
        for region in await self.service.ask("system_shm_status", request.name):
            response.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    @aborts_on_error
    async def SystemSharedMemoryRegister(self, request, context):
        await self.service.ask("system_shm_register", request.name, request.key,
                               request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @aborts_on_error
    async def SystemSharedMemoryUnregister(self, request, context):
        await self.service.ask("system_shm_unregister", request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @aborts_on_error
    async def CudaSharedMemoryStatus(self, request, context):
        response = pb.CudaSharedMemoryStatusResponse()
        for region in await self.service.ask("cuda_shm_status", request.name):
            response.regions[region["name"]].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    @aborts_on_error
    async def CudaSharedMemoryRegister(self, request, context):
        await self.service.ask("cuda_shm_register", request.name, request.raw_handle,
                               request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    @aborts_on_error
    async def CudaSharedMemoryUnregister(self, request, context):
        await self.service.ask("cuda_shm_unregister", request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # --- trace and logging extensions ---

    @aborts_on_error
    async def TraceSetting(self, request, context):
        changes = {key: list(value.value) or None for key, value in request.settings.items()}
        settings = await self.service.ask("trace_settings", request.model_name,
                                          changes or None)
        response = pb.TraceSettingResponse()
        for key, value in settings.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    @aborts_on_error
    async def LogSettings(self, request, context):
        changes = parameter_kinds.log_setting_changes(request.settings)
        settings = await self.service.ask("logging_settings", changes or None)
        response = pb.LogSettingsResponse()
        for key, value in settings.items():
            entry = response.settings[key]
            if isinstance(value, bool):
                entry.bool_param = value
            elif isinstance(value, int):
                entry.uint32_param = value
            else:
                entry.string_param = value
        return response

    # --- inference ---

    def begin_ModelInfer(self, request, context, reply):
        """Start the inference; `reply` gets the response message, or the AbortError or
        exception the call ends with, from the call that delivers the final response
        (our transport writes it from there). Returns what cancels the request."""
        raw_contents = read = None
        if type(request) is bytes:  # a small message, on our transport: read here
            try:
                request, raw_contents = message_split.split_infer_request(request)
            except DecodeError:  # as our transport answers any that does not parse
                raise native_transport.AbortError(wire.UNPARSEABLE_CODE,
                                                wire.UNPARSEABLE_MESSAGE) from None
        elif type(request) is infer_read.ReadInfer:  # read by our transport already
            read, request = request, request.message
        try:
            infer_request = self._decode(request, context, raw_contents) if read is None \
                else self._decoded(read, context)
        except TritonError as error:  # answered once the service has said why (_refusal)
            return self._refuse(request, error, reply)
        try:
            # Our transport sends what it is given as it is; grpc.aio wants the message.
            encode = codec.serialize_infer_response \
                if isinstance(context, native_transport.CallContext) \
                else codec.encode_infer_response

            def on_final(response) -> None:
                try:
                    result = _infer_result(response, encode)
                except Exception as error:  # a bug here must not reach the scheduler
                    result = error
                reply(result)

            self.service.start_unary(infer_request, "ModelInfer RPC", on_final)
        except TritonError as error:
            raise native_transport.AbortError(grpc_status(error.code), error.message) from None
        return lambda: self.service.cancel(infer_request)

    async def ModelInfer(self, request, context):
        """The coroutine form (grpc.aio), on top of `begin_ModelInfer`."""
        answer = asyncio.get_running_loop().create_future()
        try:
            cancel = self.begin_ModelInfer(request, context, functools.partial(_settle, answer))
            result = await answer
        except native_transport.AbortError as error:
            await context.abort(error.code, error.details)
        except asyncio.CancelledError:
            cancel()
            raise
        if isinstance(result, native_transport.AbortError):
            await context.abort(result.code, result.details)
        if isinstance(result, Exception):
            raise result
        return result

    async def ModelStreamInfer(self, request_messages, context):
        """Requests and responses interleave (stream_infer.stream_responses; an async
        generator function itself, as grpc.aio wants one). The request messages come
        as bytes (RAW_REQUESTS), so that one that does not parse can be answered."""
        decode = functools.partial(self._decode_streamed, context=context)
        async for message in stream_infer.stream_responses(
                self.service, request_messages, context, decode, self._refusal,
                self.options.stream_max_queued_bytes, self.options.stream_max_in_flight):
            yield message

    def _decode(self, message, context, raw_contents: list | None = None):
        """The InferenceRequest of a message, with the call's forwarded metadata; the
        message's own error when it does not decode (answered as _refusal says)."""
        infer_request = codec.decode_infer_request(message, raw_contents)
        if self.header_pattern is not None:  # as _forwarded does, inline: once per call
            forward_headers(self.header_pattern, context.invocation_metadata() or (),
                            infer_request.parameters)
        return infer_request

    def _decode_streamed(self, message, read: infer_read.ReadInfer | None, context):
        """`_decode` for a stream's message, which our transport may have read (and
        decoded) already: `read`."""
        return self._decode(message, context) if read is None else self._decoded(read, context)

    def _decoded(self, read: infer_read.ReadInfer, context):
        """`_decode`'s answer for a message our transport has decoded already."""
        if isinstance(read.decoded, TritonError):
            raise read.decoded
        return self._forwarded(read.decoded, context)

    def _refuse(self, message, error: TritonError, reply):
        """Answer a unary call whose message does not decode (`error`) through `reply`,
        with the error _refusal chooses once the service has answered; returns what
        cancels that (the client left). Only a failing message pays for the lookup."""
        async def answer() -> None:
            refusal = await self._refusal(message, error)
            reply(native_transport.AbortError(grpc_status(refusal.code), refusal.message))

        return asyncio.ensure_future(answer()).cancel

    async def _refusal(self, message, error: TritonError) -> TritonError:
        """The error that answers a message that does not decode: as in Triton, a bad
        version string first, then an unknown or failed model (NOT_FOUND whatever the
        message holds), then the message's own `error`."""
        try:
            version = parameter_kinds.model_version(message.model_version)
            await self.service.ask("model_config", message.model_name, version)
        except TritonError as refusal:
            return refusal
        return error

    def _forwarded(self, infer_request, context):
        """`infer_request` with the call's metadata that --grpc-header-forward-pattern
        finds as parameters."""
        if self.header_pattern is not None:
            forward_headers(self.header_pattern, context.invocation_metadata() or (),
                            infer_request.parameters)
        return infer_request


def _settle(future: asyncio.Future, result) -> None:
    """Give `future` its result unless its waiter was cancelled meanwhile."""
    if not future.done():
        future.set_result(result)


def _infer_result(response, encode=codec.encode_infer_response):
    """A final response as ModelInfer's message, or the AbortError it ends with."""
    if response.error is not None:
        return native_transport.AbortError(grpc_status(response.error.code),
                                         response.error.message)
    try:
        return encode(response)
    except TritonError as error:
        return native_transport.AbortError(grpc_status(error.code), error.message)


async def start_server(service: InferenceService, address: str, port: int,
                       restricted: dict[str, Restriction] | None = None,
                       transport: str = "native", tls: TlsFiles | None = None,
                       max_receive_message_size: int = MAX_MESSAGE_SIZE,
                       limits: Http2Limits | None = None, *, header_pattern=None,
                       reuse_port: bool = False, options: GrpcOptions | None = None,
                       accept_limits: AcceptLimits = AcceptLimits(),
                       sockets: list | None = None):
    """The gRPC front end listening on address:port; returns it (with `stop(grace)`)
    and the bound port. `native` is our own HTTP/2 transport, `grpcio` grpc.aio;
    `tls` puts TLS on the port (either transport). A request message larger than
    `max_receive_message_size` (after inflating) is RESOURCE_EXHAUSTED on either.
    `limits` are the HTTP/2 limits (on grpc.aio, those grpc core has); `options` the
    front end's own. Metadata whose name `header_pattern` finds becomes request
    parameters; `reuse_port` lets other servers that set it listen on the same port
    (SO_REUSEPORT); `accept_limits` bound TLS handshakes and keep file descriptors free
    (our transport; grpc core accepts on its own). Given `sockets` (bound and listening
    already, our transport only: grpc.aio binds its own, so a front-end process on it
    binds address:port again with SO_REUSEPORT), accept on those."""
    frontend = GrpcFrontend(service, restricted, header_pattern, options)
    if transport == "grpcio":
        server, bound = create_grpcio_server(frontend, address, port, tls,
                                             max_receive_message_size, limits, reuse_port)
        await server.start()
        return server, bound
    methods = native_transport.methods_of(frontend, SERVICE, pb, NATIVE_RAW_REQUESTS)
    # a ModelInfer or ModelStreamInfer message of many fields is read off the loop
    methods[MODEL_INFER] = dataclasses.replace(
        methods[MODEL_INFER], read_on_loop=infer_read.read_on_loop,
        read_anywhere=infer_read.read_anywhere)
    methods[MODEL_STREAM_INFER] = dataclasses.replace(
        methods[MODEL_STREAM_INFER], read_on_loop=infer_read.read_on_loop,
        read_anywhere=infer_read.read_stream_anywhere)
    if frontend.options.response_compression != "none":
        for path in COMPRESSED_RPCS:  # as Triton: only inference responses are compressed
            methods[path] = dataclasses.replace(methods[path], compress_responses=True)
    server = native_transport.GrpcServer(methods, max_receive_message_size, limits,
                                       frontend.options.response_compression,
                                       service.tracer, frontend.options.message_threads)
    context = server_context(tls, ["h2"]) if tls is not None else None
    try:
        bound = await server.listen(address, port, context, reuse_port, accept_limits,
                                    sockets)
    except OSError as error:
        raise RuntimeError(error.strerror) from None
    return server, bound


def begin_shutdown(server) -> None:
    """Shutdown has begun: our transport tells its clients now (a graceful GOAWAY:
    their next calls go elsewhere); grpc.aio does it in `stop`."""
    if isinstance(server, native_transport.GrpcServer):
        server.begin_shutdown()
