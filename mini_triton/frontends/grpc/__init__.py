"""The KServe v2 gRPC front end, on our own HTTP/2 transport or on grpc.aio.

- `server.py`: the servicer (routing and status mapping only), its options, and starting
  it on either transport;
- `codec.py`: a ModelInfer message becomes an InferenceRequest, a response its message
  (pure translation); `parameter_kinds.py`: the parameter kinds Triton reads itself;
- `infer_read.py`, `message_split.py`, `offload.py`: a request message read without
  copying its tensors, on the event loop while that is cheap, else on a worker thread,
  and large responses compressed there;
- `stream_infer.py`: ModelStreamInfer's bounded queue of responses;
- `native_transport.py`: our transport (the default): the connection class, made of
  `calls.py` (streams and calls: routing by `:path`, deadlines, handlers, statuses) over
  the HTTP/2 connection of `frontends/http2/`, with `request_headers.py` (header blocks in
  and their checks) and `wire.py` (gRPC's message prefix, timeout, statuses);
- `grpcio_transport.py`: the same servicer on grpc.aio (`--grpc-transport grpcio`).
"""
