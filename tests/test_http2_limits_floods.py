"""The native gRPC transport's HTTP/2 limits against floods: the offender is cut off
with the error RFC 9113 or grpc core gives, and another client is still served.

- SETTINGS_MAX_CONCURRENT_STREAMS advertised and enforced: REFUSED_STREAM beyond it.
- SETTINGS_MAX_HEADER_LIST_SIZE counted across CONTINUATION frames and as decoded
  (CVE-2024-27316): GOAWAY ENHANCE_YOUR_CALM.
- Rapid reset (CVE-2023-44487): resets of open streams beyond a budget are GOAWAY
  ENHANCE_YOUR_CALM, and no inference starts for a stream reset in the same read.
- PING (grpc core's ping strikes: "too_many_pings"), SETTINGS and empty-frame floods.
"""

from __future__ import annotations

import struct

import pytest

from h2_attacks import (CANCEL, ENHANCE_YOUR_CALM, HEADER_TABLE_SIZE, INITIAL_WINDOW_SIZE,
                        MAX_CONCURRENT_STREAMS, MAX_HEADER_LIST_SIZE, MAX_STREAMS, REFUSED_STREAM,
                        goaway_of, model_requests, raw, reset_of, send_quietly, victim_succeeds)
from h2_attacks import defaults, limited  # noqa: F401 (fixtures)
from h2_client import (CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, H2, HEADERS, INFER,
                       LIVE, MAX_FRAME_SIZE, PING, PRIORITY, RST_STREAM, SETTINGS, VALUES,
                       WINDOW_UPDATE, assert_identity, grpc_message, infer_request)


pytestmark = pytest.mark.timeout(120)


# --- the settings we advertise ---

def test_settings_advertise_the_limits(defaults, limited):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        assert client.server_settings == {
            INITIAL_WINDOW_SIZE: 4 << 20, MAX_FRAME_SIZE: 65_536, HEADER_TABLE_SIZE: 4096,
            MAX_CONCURRENT_STREAMS: 100, MAX_HEADER_LIST_SIZE: 16_384}
    with H2(limited.ports["grpc"]) as client:
        client.handshake()
        assert client.server_settings[MAX_CONCURRENT_STREAMS] == MAX_STREAMS


# --- concurrent streams ---

def test_a_stream_beyond_max_concurrent_streams_is_refused(limited):
    with H2(limited.ports["grpc"]) as client:
        client.handshake()
        for index in range(MAX_STREAMS + 1):
            client.call(1 + 2 * index, INFER, infer_request(VALUES, model="slow"))
        last = 1 + 2 * MAX_STREAMS
        assert reset_of(client, last) == REFUSED_STREAM
        for index in range(MAX_STREAMS):  # the others are taken: given up here
            client.send(RST_STREAM, 0, 1 + 2 * index, struct.pack(">I", CANCEL))
        client.call(last + 2, INFER, infer_request(VALUES))  # a slot again
        assert_identity(client.response(last + 2), VALUES)
    victim_succeeds(limited)


# --- header lists ---

def test_continuation_without_end_headers_is_cut_off_at_the_header_list_size(defaults):
    """CVE-2024-27316: CONTINUATION frames without END_HEADERS are not buffered past
    SETTINGS_MAX_HEADER_LIST_SIZE."""
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        block = client.header_block(INFER)
        flood = raw(HEADERS, 0, 1, block) + b"".join(
            raw(CONTINUATION, 0, 1, b"\x00" * 8192) for _ in range(64))  # 512 KiB at most
        send_quietly(client, flood)
        last, code, debug = goaway_of(client)
        assert (last, code) == (1, ENHANCE_YOUR_CALM), debug
    victim_succeeds(defaults)


def test_empty_continuation_frames_are_a_flood(defaults):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        block = client.header_block(INFER)
        send_quietly(client, raw(HEADERS, 0, 1, block[:3])
                     + raw(CONTINUATION, 0, 1) * 1500)
        assert goaway_of(client)[1] == ENHANCE_YOUR_CALM
    victim_succeeds(defaults)


def test_a_header_list_is_counted_as_decoded(defaults):
    """A small block can name a large table entry many times: the list is counted as
    HPACK counts it, while it is decoded."""
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        entry = ("x-big", "b" * 4000)
        client.call(1, LIVE, b"", [entry])  # the entry enters the table
        assert client.response(1).status == "0"
        block = client.encoder.encode([entry] * 5)  # five one-byte references
        assert len(block) < 100
        client.send(HEADERS, END_HEADERS, 3, block)
        assert goaway_of(client)[:2] == (3, ENHANCE_YOUR_CALM)
    victim_succeeds(defaults)


def test_a_client_without_a_dynamic_table_gets_a_table_size_update(defaults):
    """RFC 7541 §4.2: after SETTINGS_HEADER_TABLE_SIZE 0 our next header block starts
    with a dynamic table size update (to 0), once."""
    with H2(defaults.ports["grpc"], {HEADER_TABLE_SIZE: 0}) as client:
        client.decoder.max_allowed_table_size = 0
        client.handshake()
        for stream in (1, 3):
            client.call(stream, INFER, infer_request(VALUES))
            response = client.response(stream)
            assert_identity(response, VALUES)
            first_block = response.frames[0].payload
            assert (first_block[0] == 0x20) == (stream == 1), first_block[:4]


# --- rapid reset ---

def test_rapid_reset_is_goaway_enhance_your_calm_and_starts_no_inference(defaults):
    """CVE-2023-44487: streams opened and reset at once, past the reset budget (1000
    at once), end the connection; none reset in the read that ended its request is
    started (a few may straddle two reads)."""
    before = model_requests(defaults)
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        body = grpc_message(infer_request(VALUES))
        trios = []
        for index in range(1200):
            stream = 1 + 2 * index
            trios.append(raw(HEADERS, END_HEADERS, stream, client.header_block(INFER))
                         + raw(DATA, END_STREAM, stream, body)
                         + raw(RST_STREAM, 0, stream, struct.pack(">I", CANCEL)))
        send_quietly(client, b"".join(trios))
        last, code, debug = goaway_of(client)
        assert code == ENHANCE_YOUR_CALM and debug == b"too many stream resets"
        # the reset one past the budget (which refills at 33 per second meanwhile)
        assert 1 + 2 * 1000 <= last < 1 + 2 * 1100
    victim_succeeds(defaults)
    assert model_requests(defaults) - before < 1 + 20  # the victim's, and stragglers


def test_resets_within_the_budget_leave_the_connection_working(defaults):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        for stream in range(1, 200, 2):
            client.send(HEADERS, END_HEADERS, stream, client.header_block(INFER))
            client.send(RST_STREAM, 0, stream, struct.pack(">I", CANCEL))
        client.call(201, INFER, infer_request(VALUES))
        assert_identity(client.response(201), VALUES)


# --- floods ---

def test_ping_flood_is_too_many_pings(defaults):
    """grpc core's policy: with no data sent between, a PING sooner than 5 minutes
    (2 hours with no call open) after the last is a strike; the third is one too many."""
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        for index in range(4):
            client.send(PING, 0, 0, struct.pack(">Q", index))
        acks = []
        while (frame := client.read_frame()).kind != GOAWAY:
            if frame.kind == PING:
                acks.append(struct.unpack(">Q", frame.payload)[0])
        assert acks == [0, 1, 2]
        assert struct.unpack(">II", frame.payload[:8])[1] == ENHANCE_YOUR_CALM
        assert frame.payload[8:] == b"too_many_pings"
    victim_succeeds(defaults)


def test_pings_between_responses_are_no_strikes(defaults):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        for stream in range(1, 12, 2):
            client.send(PING, 0, 0, b"12345678")
            client.call(stream, INFER, infer_request(VALUES))
            assert_identity(client.response(stream), VALUES)


@pytest.mark.parametrize("flood", [
    raw(SETTINGS, 0, 0),
    raw(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)),
    raw(PRIORITY, 0, 1, struct.pack(">IB", 0, 16)),
    raw(0x42, 0, 0, b"unknown"),
    raw(RST_STREAM, 0, 1, struct.pack(">I", CANCEL)),  # of a closed stream
], ids=["settings", "window-update", "priority", "unknown-type", "reset-of-closed-stream"])
def test_frames_without_data_are_a_flood(defaults, flood):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        client.call(1, LIVE, b"")
        assert client.response(1).status == "0"
        send_quietly(client, flood * 1001)  # max_control_frames: 1000
        last, code, debug = goaway_of(client)
        assert (code, debug) == (ENHANCE_YOUR_CALM, b"too many frames without data")
    victim_succeeds(defaults)


def test_empty_data_frames_are_a_flood(defaults):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        client.send(HEADERS, END_HEADERS, 1, client.header_block(INFER))
        send_quietly(client, raw(DATA, 0, 1) * 1001)
        assert goaway_of(client)[:2] == (1, ENHANCE_YOUR_CALM)
    victim_succeeds(defaults)
