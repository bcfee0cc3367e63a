"""The KServe v2 REST front end on our HTTP/1.1 server (`../http1/`): its routes and
status mapping (`server.py`, `HttpFrontend`), where an HTTP infer body becomes an
`InferenceRequest` and a response becomes JSON or binary tensors (`http_codec.py`, its
parameters in `http_parameters.py`, NaN and infinities in `json_nonfinite.py`), and the
generate extension (`generate.py` the codec, `generate_routes.py` its routes and
server-sent events)."""
