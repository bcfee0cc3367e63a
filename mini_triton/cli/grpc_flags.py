"""The gRPC front end's flags of our own: what a call and a stream may hold (the
native transport's HTTP/2 limits, then tritonserver's keepalive flags in milliseconds,
which grpc.aio gets too), and response compression."""

from __future__ import annotations

import argparse

from ..frontends.grpc.native_transport import DEFAULT_MESSAGE_THREADS
from ..frontends.grpc.server import GrpcOptions
from ..frontends.grpc.stream_infer import (DEFAULT_STREAM_MAX_IN_FLIGHT,
                                           DEFAULT_STREAM_MAX_QUEUED_BYTES)
from ..frontends.grpc.wire import COMPRESSION_LEVELS
from ..frontends.http2.limits import Http2Limits
from .flag_types import boolean, in_range, non_negative, non_negative_float, \
    non_negative_seconds, positive


def add_grpc_flags(add) -> None:
    """Response compression, the streams' bounds and the HTTP/2 limits."""
    add("--grpc-infer-response-compression-level", type=str.lower,
        choices=COMPRESSION_LEVELS, default="none", help="ModelInfer and ModelStreamInfer "
        "responses compressed with gzip or deflate, as the client's grpc-accept-encoding "
        "allows (grpc core's choice for the level)")
    add("--grpc-stream-max-requests-in-flight", type=non_negative, metavar="N",
        default=DEFAULT_STREAM_MAX_IN_FLIGHT, help="requests of one ModelStreamInfer call "
        "under way at once; past it the next is not read until one ends (0: no limit)")
    add("--grpc-stream-max-queued-bytes", type=non_negative, metavar="BYTES",
        default=DEFAULT_STREAM_MAX_QUEUED_BYTES, help="responses of one ModelStreamInfer "
        "call waiting for its client (each counts 1 KiB more than its size); past it the "
        "stream ends RESOURCE_EXHAUSTED and its requests are cancelled (0: no limit)")
    add("--grpc-message-thread-count", type=in_range(1, 128), metavar="N",
        default=DEFAULT_MESSAGE_THREADS, help="threads that inflate and read large or "
        "many-field request messages and compress large responses, off the event loop "
        "(native transport)")
    add_grpc_http2_flags(add)


def grpc_options(args: argparse.Namespace) -> GrpcOptions:
    return GrpcOptions(stream_max_queued_bytes=args.grpc_stream_max_queued_bytes,
                       stream_max_in_flight=args.grpc_stream_max_requests_in_flight,
                       response_compression=args.grpc_infer_response_compression_level,
                       message_threads=args.grpc_message_thread_count)


HTTP2_DEFAULTS = Http2Limits()


def add_grpc_http2_flags(add) -> None:
    d = HTTP2_DEFAULTS
    add("--grpc-http2-max-concurrent-streams", type=positive, metavar="N",
        default=d.max_concurrent_streams, help="streams open at once per connection "
        "(SETTINGS_MAX_CONCURRENT_STREAMS); more are refused with REFUSED_STREAM")
    add("--grpc-http2-max-header-list-size", type=positive, metavar="BYTES",
        default=d.max_header_list_size, help="largest request header list, counted across "
        "CONTINUATION frames (SETTINGS_MAX_HEADER_LIST_SIZE); larger is GOAWAY "
        "ENHANCE_YOUR_CALM")
    add("--grpc-http2-max-frame-size", type=in_range(16_384, 2**24 - 1), metavar="BYTES",
        default=d.max_frame_size, help="largest frame a client may send "
        "(SETTINGS_MAX_FRAME_SIZE); larger is GOAWAY FRAME_SIZE_ERROR")
    add("--grpc-http2-initial-window-size", type=in_range(65_535, 2**31 - 1),
        metavar="BYTES", default=d.initial_window_size, help="request bytes a stream may "
        "send ahead of its handler (SETTINGS_INITIAL_WINDOW_SIZE)")
    add("--grpc-http2-write-buffer-size", type=positive, metavar="BYTES",
        default=d.write_buffer_size, help="unsent output per connection past which its "
        "requests are not read until the client reads")
    add("--grpc-http2-max-held-back-bytes", type=non_negative, metavar="BYTES",
        default=d.max_held_back_bytes, help="response bytes per connection waiting for "
        "the client's flow-control window past which new streams are refused")
    add("--grpc-http2-held-back-cutoff-bytes", type=non_negative, metavar="BYTES",
        default=d.held_back_cutoff_bytes, help="response bytes per connection waiting for "
        "its window past which a call's response is not kept: the call ends "
        "RESOURCE_EXHAUSTED (a response alone is always kept; 0: no limit)")
    add("--grpc-max-connections", type=non_negative, metavar="N",
        default=d.max_connections, help="open gRPC connections; more get GOAWAY saying so "
        "and are closed (0: no limit)")
    add("--grpc-http2-reset-burst", type=positive, metavar="N", default=d.reset_burst,
        help="resets of open streams a client may send at once (rapid reset); more is "
        "GOAWAY ENHANCE_YOUR_CALM")
    add("--grpc-http2-reset-rate", type=non_negative_float, metavar="PER_SECOND",
        default=d.reset_rate, help="resets of open streams per second, past the burst")
    add("--grpc-http2-max-control-frames", type=positive, metavar="N",
        default=d.max_control_frames, help="frames in a row that carry no data (SETTINGS, "
        "PRIORITY, WINDOW_UPDATE, empty DATA or CONTINUATION, ...); more is GOAWAY "
        "ENHANCE_YOUR_CALM")
    add("--grpc-http2-frame-timeout-secs", type=non_negative_seconds, metavar="SECONDS",
        default=d.frame_timeout, help="time the preface, or a frame once begun, may take "
        "to arrive (0: no limit)")
    add("--grpc-http2-settings-timeout-secs", type=non_negative_seconds, metavar="SECONDS",
        default=d.settings_timeout, help="time the client has to acknowledge our SETTINGS; "
        "then GOAWAY SETTINGS_TIMEOUT (0: no limit)")
    add("--grpc-http2-idle-timeout-secs", type=non_negative_seconds, metavar="SECONDS",
        default=d.idle_timeout, help="a connection with no stream open this long gets "
        "GOAWAY and is closed (0: no limit)")
    add("--grpc-http2-stall-timeout-secs", type=non_negative_seconds, metavar="SECONDS",
        default=d.stall_timeout, help="a connection whose waiting output does not move "
        "this long (its client reads nothing or opens no window) is closed (0: no limit)")
    add("--grpc-keepalive-time", type=non_negative, metavar="MS",
        default=round(d.keepalive_time * 1000), help="a PING after this long with nothing "
        "received (with a call open, unless permitted without calls)")
    add("--grpc-keepalive-timeout", type=non_negative, metavar="MS",
        default=round(d.keepalive_timeout * 1000), help="a keepalive PING not answered "
        "this long closes the connection")
    add("--grpc-keepalive-permit-without-calls", type=boolean,
        default=d.keepalive_permit_without_calls, help="keepalive PINGs with no call open, "
        "and client PINGs with no call open policed at "
        "--grpc-http2-min-recv-ping-interval-without-data, not two hours")
    add("--grpc-http2-max-pings-without-data", type=non_negative, metavar="N",
        default=d.max_pings_without_data, help="keepalive PINGs sent between two of our "
        "data or header frames (0: no limit)")
    add("--grpc-http2-min-recv-ping-interval-without-data", type=non_negative, metavar="MS",
        default=round(d.min_recv_ping_interval * 1000), help="a client PING sooner than "
        "this after the last, with no data sent between, is a strike")
    add("--grpc-http2-max-ping-strikes", type=non_negative, metavar="N",
        default=d.max_ping_strikes, help="strikes tolerated; one more is GOAWAY "
        "ENHANCE_YOUR_CALM too_many_pings (0: no limit)")
    add("--grpc-max-connection-age", type=non_negative, metavar="MS", default=0,
        help="a connection this old (give or take a tenth) gets a graceful GOAWAY (0: no "
        "limit)")
    add("--grpc-max-connection-age-grace", type=non_negative, metavar="MS", default=0,
        help="then its calls have this long before it closes (0: no limit)")


def grpc_http2_limits(args: argparse.Namespace) -> Http2Limits:
    return Http2Limits(
        max_concurrent_streams=args.grpc_http2_max_concurrent_streams,
        max_header_list_size=args.grpc_http2_max_header_list_size,
        max_frame_size=args.grpc_http2_max_frame_size,
        initial_window_size=args.grpc_http2_initial_window_size,
        write_buffer_size=args.grpc_http2_write_buffer_size,
        max_held_back_bytes=args.grpc_http2_max_held_back_bytes,
        held_back_cutoff_bytes=args.grpc_http2_held_back_cutoff_bytes,
        max_connections=args.grpc_max_connections,
        settings_timeout=args.grpc_http2_settings_timeout_secs,
        reset_burst=args.grpc_http2_reset_burst, reset_rate=args.grpc_http2_reset_rate,
        max_control_frames=args.grpc_http2_max_control_frames,
        frame_timeout=args.grpc_http2_frame_timeout_secs,
        idle_timeout=args.grpc_http2_idle_timeout_secs,
        stall_timeout=args.grpc_http2_stall_timeout_secs,
        keepalive_time=args.grpc_keepalive_time / 1000,
        keepalive_timeout=args.grpc_keepalive_timeout / 1000,
        keepalive_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        max_pings_without_data=args.grpc_http2_max_pings_without_data,
        min_recv_ping_interval=args.grpc_http2_min_recv_ping_interval_without_data / 1000,
        max_ping_strikes=args.grpc_http2_max_ping_strikes,
        max_connection_age=args.grpc_max_connection_age / 1000,
        max_connection_age_grace=args.grpc_max_connection_age_grace / 1000)
