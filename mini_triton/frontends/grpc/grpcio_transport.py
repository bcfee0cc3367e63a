"""The gRPC front end on grpc.aio (--grpc-transport grpcio): grpc core's options as
tritonserver sets them, and the servicer's handlers added so that each reads its own
request messages, off the event loop when that costs much (as our transport does:
offload.py; grpc core itself inflates and compresses off the loop)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from ..http2.limits import Http2Limits
from ..tls import TlsFiles
from . import infer_read, message_split, native_transport, wire
from .offload import PARSE_OFF_LOOP_FROM, READ_CHECKED_FROM, collector_paused
from .wire import COMPRESSION_LEVELS

MAX_MESSAGE_SIZE = native_transport.MAX_MESSAGE_SIZE  # INT32_MAX, as tritonserver sets it
SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
# The RPCs whose handlers parse their request messages themselves (they get bytes).
RAW_REQUESTS = frozenset({"ModelStreamInfer"})


def server_options(max_receive_message_size: int = MAX_MESSAGE_SIZE,
                   limits: Http2Limits | None = None, reuse_port: bool = False) -> list:
    """grpc.aio's options; grpc core bounds a received message, inflated or not, by
    max_receive_message_length. The keepalive settings go to grpc core as tritonserver
    passes them, with the concurrent streams and header list limits."""
    limits = limits or Http2Limits()
    options = [("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
               ("grpc.max_receive_message_length", max_receive_message_size),
               ("grpc.so_reuseport", int(reuse_port)),
               ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
               ("grpc.absolute_max_metadata_size", limits.max_header_list_size),
               ("grpc.keepalive_time_ms", _ms(limits.keepalive_time)),
               ("grpc.keepalive_timeout_ms", _ms(limits.keepalive_timeout)),
               ("grpc.keepalive_permit_without_calls",
                int(limits.keepalive_permit_without_calls)),
               ("grpc.http2.max_pings_without_data", limits.max_pings_without_data),
               ("grpc.http2.min_recv_ping_interval_without_data_ms",
                _ms(limits.min_recv_ping_interval)),
               ("grpc.http2.max_ping_strikes", limits.max_ping_strikes)]
    if limits.max_connections:
        options.append(("grpc.max_allowed_incoming_connections", limits.max_connections))
    if limits.max_connection_age > 0:  # as tritonserver: set only when given
        options.append(("grpc.max_connection_age_ms", _ms(limits.max_connection_age)))
    if limits.max_connection_age_grace > 0:
        options.append(("grpc.max_connection_age_grace_ms",
                        _ms(limits.max_connection_age_grace)))
    return options


def _ms(seconds: float) -> int:
    return min(2**31 - 1, round(seconds * 1000))


def _add_handlers(frontend, server: grpc.aio.Server, workers: ThreadPoolExecutor) -> None:
    """Every RPC of the service on grpc.aio, as the generated code adds them, but each
    handler reads its own request messages (the messages of RAW_REQUESTS reach it as
    bytes, or read already when large): a unary message that does not parse is INTERNAL
    "Unable to parse request", grpc C++'s answer and so tritonserver's, not grpc.aio's
    UNKNOWN. `workers` read the large ones."""
    handlers = {}
    for method in SERVICE.methods:
        request = getattr(pb, method.input_type.name)
        response = getattr(pb, method.output_type.name)
        handler = getattr(frontend, method.name)
        if method.name in RAW_REQUESTS:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                _reading_stream(handler, workers),
                response_serializer=response.SerializeToString)
        elif method.client_streaming:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                handler, request_deserializer=request.FromString,
                response_serializer=response.SerializeToString)
        else:
            read = _read_infer if method.name == "ModelInfer" else _read_message
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _parsing(handler, request, read, workers),
                response_serializer=response.SerializeToString)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
    server.add_registered_method_handlers(SERVICE.full_name, handlers)


def _parsing(handler, request_type, read, workers: ThreadPoolExecutor):
    """A unary handler taking its request message as bytes: protobuf parses a small one
    here, `read` a larger one (maybe on a worker)."""

    async def parse_then_handle(raw: bytes, context):
        try:
            request = request_type.FromString(raw) if len(raw) < READ_CHECKED_FROM \
                else await read(request_type, raw, workers)
        except DecodeError:
            await context.abort(wire.UNPARSEABLE_CODE, wire.UNPARSEABLE_MESSAGE)
        return await handler(request, context)

    return parse_then_handle


async def _read_infer(request_type, raw: bytes, workers: ThreadPoolExecutor):
    """A ModelInfer message as our transport reads it (infer_read): here when that
    is cheap, else on a worker; DecodeError when it does not parse."""
    read = infer_read.read_on_loop(raw)
    if read is None:
        read = await asyncio.get_running_loop().run_in_executor(
            workers, collector_paused, infer_read.read_anywhere, raw)
    return read


async def _read_message(request_type, raw: bytes, workers: ThreadPoolExecutor):
    """Another RPC's message: parsed here when small, else on a worker in pieces."""
    if len(raw) < PARSE_OFF_LOOP_FROM:
        return request_type.FromString(raw)
    return await asyncio.get_running_loop().run_in_executor(
        workers, collector_paused, message_split.parse_in_pieces, request_type, raw)


def _reading_stream(handler, workers: ThreadPoolExecutor):
    """A streaming handler of RAW_REQUESTS whose large request messages reach it read
    (infer_read.ReadInfer, read on a worker when costly) and the rest as bytes."""

    async def read_then_handle(request_iterator, context):
        async for response in handler(_read_stream_messages(request_iterator, workers),
                                      context):
            yield response

    return read_then_handle


async def _read_stream_messages(request_iterator, workers: ThreadPoolExecutor):
    loop = asyncio.get_running_loop()
    async for raw in request_iterator:
        if len(raw) >= READ_CHECKED_FROM:
            read = infer_read.read_on_loop(raw)
            raw = read if read is not None else await loop.run_in_executor(
                workers, collector_paused, infer_read.read_stream_anywhere, raw)
        yield raw


def create_grpcio_server(frontend, address: str, port: int,
                         tls: TlsFiles | None = None,
                         max_receive_message_size: int = MAX_MESSAGE_SIZE,
                         limits: Http2Limits | None = None, reuse_port: bool = False,
                         ) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server bound to address:port; returns it with the bound port."""
    options = server_options(max_receive_message_size, limits, reuse_port)
    level = frontend.options.response_compression
    if level != "none":
        # grpc core chooses each call's algorithm from the client's grpc-accept-encoding
        # as Triton's set_compression_level does, but for every RPC, not only inference
        options.append(("grpc.default_compression_level", COMPRESSION_LEVELS.index(level)))
    server = grpc.aio.server(options=options, compression=grpc.Compression.NoCompression)
    # offload's work on this transport: reading large or many-field messages
    _add_handlers(frontend, server, ThreadPoolExecutor(frontend.options.message_threads,
                                                       "grpc-messages"))
    if tls is None:
        return server, server.add_insecure_port(f"{address}:{port}")
    cert, key, root = tls.pem()
    credentials = grpc.ssl_server_credentials([(key, cert)], root_certificates=root,
                                              require_client_auth=tls.mutual)
    return server, server.add_secure_port(f"{address}:{port}", credentials)
