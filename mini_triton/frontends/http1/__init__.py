"""Our HTTP/1.1 server, an asyncio protocol on httptools: listening (`listener.py`), a
connection (`protocol.py`), its request heads and bodies (`head.py`, `body.py`), the
request/reply pairs in order (`exchange.py`), routes (`router.py`), writing replies
(`output.py`, `encoding.py`), its limits and timers, and the worker thread that takes
large work off the event loop (`offload.py`). It knows nothing of inference: the routes
of the front ends above it (`kserve_rest/`, `openai/`, `cloud/`) are its handlers."""
