"""The triton_python_backend_utils module and the worker wire format, without a server."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

import mini_triton.backends.python  # noqa: F401  (registers triton_python_backend_utils)
import triton_python_backend_utils as pb_utils
from mini_triton.backends.python import utils
from mini_triton.backends.python.convert import Reply
from mini_triton.backends.python.convert import get_reply, put_reply
from mini_triton.core.link.wire import SHARED_THRESHOLD, Link, Outgoing, get_tensors, put_tensors


def test_the_module_is_defined_once():
    assert pb_utils is utils
    assert pb_utils.Tensor is utils.Tensor


def test_the_package_folder_is_defined_once():
    """mini_triton.PACKAGE_DIR is the one place our own folder is worked out (a worker's
    PYTHONPATH, the execution environment's link, the frames hidden from tracebacks):
    no other module derives it from a `__file__` of ours."""
    import re
    from pathlib import Path

    import mini_triton
    from mini_triton.backends.python import exec_env, runner, worker_process

    package = Path(mini_triton.__file__).resolve().parent
    assert mini_triton.PACKAGE_DIR == package
    own_file = re.compile(r"(?<![\w.])__file__|\bmini_triton\.__file__")
    deriving = sorted(str(path.relative_to(package)) for path in package.rglob("*.py")
                      if path != package / "__init__.py" and own_file.search(path.read_text()))
    assert deriving == []
    assert runner._OWN_FILES == str(package)
    assert worker_process._PACKAGE_ROOT == str(package.parent)
    assert exec_env.PACKAGE_DIR is mini_triton.PACKAGE_DIR


@pytest.mark.parametrize("config_type, code, dtype", [
    ("TYPE_BOOL", 1, np.bool_), ("TYPE_UINT8", 2, np.uint8), ("TYPE_INT32", 8, np.int32),
    ("TYPE_FP16", 10, np.float16), ("TYPE_FP32", 11, np.float32), ("TYPE_FP64", 12, np.float64),
    ("TYPE_STRING", 13, np.object_)])
def test_type_tables(config_type, code, dtype):
    assert np.dtype(pb_utils.triton_string_to_numpy(config_type)) == np.dtype(dtype)
    assert pb_utils.triton_to_numpy_type(code) == dtype
    assert pb_utils.numpy_to_triton_type(dtype) == code


def test_type_codes_are_the_model_config_values_for_every_type():
    # The codes follow the order of core's datatype table: a reordering must fail here.
    from tritonclient.grpc import model_config_pb2 as mc

    for config_name, code, v2, _ in utils._TYPES:
        assert mc.DataType.Value(config_name) == code, v2
    assert len(utils._TYPES) == len(mc.DataType.values()) - 1  # all but TYPE_INVALID


def test_bytes_serialization_round_trip():
    array = np.array([b"a", b"", "\u00e9".encode(), b"\x00\x01"], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(array)
    assert encoded[:4] == b"\x01\x00\x00\x00"
    assert list(pb_utils.deserialize_bytes_tensor(encoded)) == list(array)
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)) == ()


def test_tensor_of_strings_holds_bytes_objects():
    tensor = pb_utils.Tensor("T", np.array([["ab", "c"]]))
    assert tensor.triton_dtype() == 13 and tensor.shape() == [1, 2]
    assert tensor.as_numpy().dtype == np.object_
    assert tensor.as_numpy().tolist() == [[b"ab", b"c"]]


def test_tensor_makes_arrays_contiguous_and_native():
    tensor = pb_utils.Tensor("T", np.arange(12, dtype=">i4").reshape(3, 4).T)
    array = tensor.as_numpy()
    assert array.flags.c_contiguous and array.dtype.isnative
    assert tensor.triton_dtype() == 8
    np.testing.assert_array_equal(array, np.arange(12).reshape(3, 4).T)


def test_tensor_refuses_what_triton_cannot_carry():
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("T", np.zeros(2, np.complex64))
    with pytest.raises(TypeError):  # not an array: Triton's binding refuses the call
        pb_utils.Tensor("T", [1, 2])


def test_dlpack_round_trip_shares_memory():
    array = np.arange(6, dtype=np.float32)
    tensor = pb_utils.Tensor("T", array)
    again = pb_utils.Tensor.from_dlpack("U", tensor.to_dlpack())
    assert again.name() == "U"
    np.testing.assert_array_equal(again.as_numpy(), array)
    assert np.shares_memory(again.as_numpy(), array)
    from_object = pb_utils.Tensor.from_dlpack("V", tensor)
    np.testing.assert_array_equal(from_object.as_numpy(), array)


def test_error_codes_and_messages():
    error = pb_utils.TritonError("bad input", pb_utils.TritonError.INVALID_ARG)
    assert error.message() == "bad input" and error.code() == pb_utils.TritonError.INVALID_ARG
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    response = pb_utils.InferenceResponse(error=error)
    assert response.has_error() and response.error() is error
    assert response.output_tensors() == []


def test_bls_request_checks_its_arguments():
    with pytest.raises(pb_utils.TritonModelException, match="Correlation ID"):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[],
                                  correlation_id=1.5)
    with pytest.raises(pb_utils.TritonModelException, match="bool/int/str"):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[],
                                  parameters={"x": 1.5})
    request = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=["O"],
                                        correlation_id="seq", parameters={"k": True})
    assert request.correlation_id() == "seq" and request.parameters() == '{"k": true}'


def test_bls_outside_a_server_says_so():
    request = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    token = utils._HOST.set(utils._NoHost())  # as in a process that serves no model
    try:
        with pytest.raises(pb_utils.TritonModelException, match="needs a model served"):
            request.exec()
    finally:
        utils._HOST.reset(token)


def test_response_sender_closes_after_the_final_flag():
    sent = []

    class Handle:
        def send(self, response, final):
            sent.append((response, final))

    sender = pb_utils.InferenceResponseSender(Handle())
    sender.send(pb_utils.InferenceResponse())
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert [final for _, final in sent] == [False, True] and sent[1][0] is None
    with pytest.raises(pb_utils.TritonModelException, match="closed"):
        sender.send(pb_utils.InferenceResponse())
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponseSender(Handle()).send(None, 0)


def model_config():
    return pb_utils.ModelConfig('{"name": "m", "max_batch_size": 0, "input": ['
                                '{"name": "A", "data_type": "TYPE_INVALID", "dims": []}], '
                                '"output": []}')


def test_model_config_completes_inputs_outputs_and_batching():
    config = model_config()
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "B", "data_type": "TYPE_INT32", "dims": [-1], "optional": True})
    config.add_output({"name": "C", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": True})
    completed = config.as_dict()
    assert completed["input"][0] == {"name": "A", "data_type": "TYPE_FP32", "dims": [4]}
    assert [i["name"] for i in completed["input"]] == ["A", "B"]
    assert completed["max_batch_size"] == 8 and completed["dynamic_batching"] == {}
    assert completed["model_transaction_policy"] == {"decoupled": True}


@pytest.mark.parametrize("change, message", [
    (lambda c: c.add_input({"name": "A", "data_type": "TYPE_FP32"}), "missing 'dims'"),
    (lambda c: c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [1], "x": 1}),
     "contains property other than"),
    (lambda c: (c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [1]}),
                c.add_input({"name": "A", "data_type": "TYPE_INT8", "dims": [1]})),
     "configuration expects datatype TYPE_FP32"),
    (lambda c: (c.set_max_batch_size(4), c.set_max_batch_size(2)),
     "configuration specified max_batch_size 4"),
    (lambda c: (c.set_model_transaction_policy({"decoupled": True}),
                c.set_model_transaction_policy({"decoupled": False})),
     "trying to change decoupled property"),
])
def test_model_config_refuses_conflicts(change, message):
    with pytest.raises(ValueError, match=message):
        change(model_config())


# Triton 2.51's triton_python_backend_utils.ModelConfig messages, word for word.
AUTO_COMPLETE_MESSAGES = [
    (lambda c: c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [1], "x": 1}),
     "input 'A' in auto-complete-config function for model 'm' contains property other than "
     "'name', 'data_type', 'dims' and 'optional'."),
    (lambda c: c.add_output({"name": "C", "data_type": "TYPE_FP32", "dims": [1],
                             "optional": True}),
     "output 'C' in auto-complete-config function for model 'm' contains property other than "
     "'name', 'data_type' and 'dims'."),
    (lambda c: c.add_input({"data_type": "TYPE_FP32", "dims": [1]}),
     "input in auto-complete-config function for model 'm' is missing 'name' property."),
    (lambda c: c.add_output({"name": "C", "dims": [1]}),
     "output 'C' in auto-complete-config function for model 'm' is missing 'data_type' "
     "property."),
    (lambda c: c.add_input({"name": "A", "data_type": "TYPE_FP32"}),
     "input 'A' in auto-complete-config function for model 'm' is missing 'dims' property."),
    (lambda c: (c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [1]}),
                c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2]})),
     "model 'm', tensor 'A': the model expects dims [2] but the model configuration specifies "
     "dims [1]"),
    (lambda c: (c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [1],
                             "optional": False}),
                c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [1],
                             "optional": True})),
     "model 'm', tensor 'A': the model expects optional True but the model configuration "
     "specifies optional False"),
    (lambda c: (c.add_output({"name": "C", "data_type": "TYPE_FP32", "dims": [1]}),
                c.add_output({"name": "C", "data_type": "TYPE_INT8", "dims": [1]})),
     "unable to load model 'm', configuration expects datatype TYPE_FP32 for output 'C', "
     "model provides TYPE_INT8"),
    (lambda c: (c.set_max_batch_size(4), c.set_max_batch_size(2)),
     "configuration specified max_batch_size 4, but in auto-complete-config function for "
     "model 'm' specified max_batch_size 2"),
    (lambda c: c.set_model_transaction_policy({"decoupled": True, "x": 1}),
     "model transaction property in auto-complete-config function for model 'm' contains "
     "property other than 'decoupled'."),
    (lambda c: (c.set_model_transaction_policy({"decoupled": True}),
                c.set_model_transaction_policy({"decoupled": False})),
     "trying to change decoupled property in auto-complete-config for model 'm', which is "
     "already set to 'True'."),
]


@pytest.mark.parametrize("change, message", AUTO_COMPLETE_MESSAGES)
def test_auto_complete_property_messages_are_triton_s(change, message):
    with pytest.raises(ValueError) as caught:
        change(model_config())
    assert str(caught.value) == message


@pytest.fixture
def link_pair():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pair = Link(left), Link(right)
    yield pair
    for link in pair:
        link.close()


def test_wire_carries_tensors_inline_and_in_shared_memory(link_pair):
    sender, receiver = link_pair
    small = np.arange(10, dtype=np.int16)
    large = np.random.default_rng(0).random((SHARED_THRESHOLD // 8 + 3,))
    text = np.array([[b"x", b"yz"]], dtype=np.object_)
    tensors = [("S", "INT16", small), ("L", "FP64", large), ("B", "BYTES", text),
               ("E", "FP32", np.zeros((0, 3), np.float32))]
    outgoing = Outgoing()
    descriptors = put_tensors(outgoing, tensors)
    assert {d[3] for d in descriptors} == {0, 1}  # both inline and shared
    sender.send({"op": "t", "tensors": descriptors}, outgoing)
    sender.send({"op": "second"})
    message = receiver.recv()
    received = get_tensors(message, message.meta["tensors"])
    for (name, datatype, array), (got_name, got_type, got) in zip(tensors, received):
        assert (name, datatype) == (got_name, got_type) and got.shape == array.shape
        np.testing.assert_array_equal(got, array)
    assert received[0][2].flags.writeable
    assert receiver.recv().meta == {"op": "second"}


def test_wire_stacks_parts_along_the_batch_dimension(link_pair):
    sender, receiver = link_pair
    parts = [np.full((2, 4), i, np.float32) for i in range(3)]
    outgoing = Outgoing()
    descriptor = outgoing.tensor("X", "FP32", (6, 4), parts)
    sender.send({"x": descriptor}, outgoing)
    message = receiver.recv()
    np.testing.assert_array_equal(message.array(message.meta["x"]), np.concatenate(parts))


def test_wire_replies_and_many_messages_in_flight(link_pair):
    sender, receiver = link_pair
    count = 300
    payload = np.arange(50_000, dtype=np.float32)  # some inline, some shared below

    def send_all():
        for index in range(count):
            outgoing = Outgoing()
            array = payload if index % 3 else np.tile(payload, 2)
            reply = Reply([("OUT", "FP32", array)], None, '{"i": %d}' % index)
            sender.send({"i": index, "reply": put_reply(outgoing, reply)}, outgoing)

    thread = threading.Thread(target=send_all)
    thread.start()
    for index in range(count):
        message = receiver.recv()
        assert message.meta["i"] == index
        reply = get_reply(message, message.meta["reply"])
        assert reply.parameters == '{"i": %d}' % index
        assert reply.outputs[0][2].size == (50_000 if index % 3 else 100_000)
    thread.join()


def test_wire_reports_a_closed_peer(link_pair):
    sender, receiver = link_pair
    sender.close()
    with pytest.raises(EOFError):
        receiver.recv()


def _ping_pong(sender, receiver, arrays) -> list:
    """Send each array to `receiver`, which answers with an empty message (carrying
    the blocks it is done with back); the arrays as received, each checked."""
    for array in arrays:
        outgoing = Outgoing()
        sender.send({"t": put_tensors(outgoing, [("X", "FP32", array)])}, outgoing)
        message = receiver.recv()
        (_, _, got), = get_tensors(message, message.meta["t"])
        assert got.tobytes() == array.tobytes()
        del got
        message.forget()
        receiver.send({"op": "ack"})
        sender.recv()


@pytest.mark.parametrize("elements", [150_528, 1024 * 1024])  # one image (588 KiB), 4 MiB
def test_wire_reuses_its_shared_memory_for_every_message(link_pair, elements):
    sender, receiver = link_pair
    rng = np.random.default_rng(elements)
    _ping_pong(sender, receiver, [rng.random(elements, dtype=np.float32) for _ in range(20)])
    # One segment made once, every block given back: nothing created per message.
    assert sender.arena.created == 1
    assert sender.arena.in_use() <= 4 * elements + 64  # at most the last, until the next send
    assert receiver.arena.created == 0  # the answers were small: inline


def test_wire_view_held_by_the_receiver_keeps_its_bytes(link_pair):
    sender, receiver = link_pair
    rng = np.random.default_rng(1)
    first = rng.random(150_528, dtype=np.float32)
    outgoing = Outgoing()
    sender.send({"t": put_tensors(outgoing, [("X", "FP32", first)])}, outgoing)
    message = receiver.recv()
    (_, _, kept), = get_tensors(message, message.meta["t"])
    message.forget()
    receiver.send({"op": "ack"})
    sender.recv()
    _ping_pong(sender, receiver, [rng.random(150_528, dtype=np.float32) for _ in range(10)])
    assert kept.tobytes() == first.tobytes()  # its block was not written again
    assert sender.arena.in_use() >= first.nbytes
    del kept
    receiver.send({"op": "ack"})
    sender.recv()
    assert sender.arena.in_use() == 0


def test_wire_returns_blocks_to_a_sender_that_hears_nothing_else(link_pair):
    sender, receiver = link_pair
    for _ in range(8):  # a stream of responses: the receiver sends nothing meanwhile
        outgoing = Outgoing()
        sender.send({"t": put_tensors(outgoing, [("X", "FP32", np.ones(100_000, np.float32))])},
                    outgoing)
        message = receiver.recv()
        get_tensors(message, message.meta["t"])
        message.forget()  # the response was written: its views are gone
    receiver.return_freed(8)
    assert sender.recv().meta["op"] == "freed"
    assert sender.arena.in_use() == 0 and sender.arena.created == 1


def test_arena_blocks_are_taken_first_fit_and_merged_when_given_back():
    from mini_triton.core.link.arena import Arena

    arena = Arena(segment_bytes=1 << 20)
    blocks = [arena.take(100_000) for _ in range(4)]  # rounded up to 64-byte multiples
    assert [b.offset for b in blocks] == [0, 100_032, 200_064, 300_096]
    arena.free([(1, blocks[1].offset), (1, blocks[2].offset)])  # a hole of two blocks
    again = arena.take(200_000)
    assert again.offset == blocks[1].offset  # the merged hole, first fit
    arena.free([(1, b.offset) for b in (blocks[0], again, blocks[3])])
    assert arena.in_use() == 0 and arena.created == 1
    whole = arena.take(1 << 20)  # everything merged back into one free range
    assert (whole.segment.id, whole.offset) == (1, 0)
    arena.close()


def test_arena_grows_by_a_segment_for_a_burst_and_gives_it_back():
    from mini_triton.core.link.arena import Arena

    arena = Arena(segment_bytes=1 << 20)
    first = arena.take(800_000)
    burst = arena.take(3 << 20)  # does not fit: a segment of its own, rounded to 4 MiB
    assert burst.segment.id == 2 and burst.segment.size == 4 << 20 and arena.created == 2
    arena.free([(2, burst.offset)])
    assert arena.take_dropped() == [2] and set(arena.segments) == {1}  # the first stays
    arena.free([(1, first.offset)])
    assert arena.take_dropped() == [] and arena.in_use() == 0
    arena.close()


def test_wire_sends_the_rest_of_a_message_the_socket_took_only_part_of(link_pair):
    """With a timeout the socket does not block in sendmsg: a message of inline arrays
    larger than its send buffer goes out in part, and the rest follows by the byte
    (the arrays travel as they lie, whatever their element size)."""
    sender, receiver = link_pair
    sender.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sender.sock.settimeout(10)
    arrays = [np.arange(7_000 + index, dtype=dtype)
              for index, dtype in enumerate((np.float32, np.int16, np.float64, np.uint8))]
    assert all(array.nbytes < SHARED_THRESHOLD for array in arrays)
    tensors = [(f"T{index}", datatype, array) for index, (datatype, array)
               in enumerate(zip(("FP32", "INT16", "FP64", "UINT8"), arrays))]
    partial = []
    send_rest = sender._send_rest
    sender._send_rest = lambda pieces, sent: (partial.append(sent), send_rest(pieces, sent))

    def send() -> None:
        outgoing = Outgoing()
        sender.send({"tensors": put_tensors(outgoing, tensors)}, outgoing)

    thread = threading.Thread(target=send)
    thread.start()
    message = receiver.recv()
    thread.join()
    assert partial  # the kernel took only part at first
    for (name, _, array), (got_name, _, got) in zip(
            tensors, get_tensors(message, message.meta["tensors"])):
        assert got_name == name and got.dtype == array.dtype
        np.testing.assert_array_equal(got, array)
