"""The Vertex AI front end (`--allow-vertex-ai`): the routes of Triton's
vertex_ai_server.cc on a port of its own.

- AIP_HEALTH_ROUTE (`GET`): 200 when the server is ready, else 400.
- AIP_PREDICT_ROUTE (`POST`): inference on the default model; with the header
  `X-Vertex-Ai-Triton-Redirect: v2/...` the request goes to that v2 route instead
  (Vertex AI sends only POST, so each route's own method is used), or to `metrics`.

A request body's JSON header length travels in the content type
(`application/vnd.vertex-ai-triton.binary+json;json-header-size=N`).

`--http-restricted-api` holds here as on the HTTP port (tritonserver 2.51 leaves the
Vertex AI port open): a redirect reaches a v2 route through the same guard, and the
port's own routes are their groups' (the health route "health", prediction
"inference"). `metrics` stays open, as the metrics port is.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from ...core.errors import invalid_arg
from ...service import InferenceService
from ..http1.exchange import Exchange, HttpReply, HttpRequest
from ..kserve_rest.server import V2_REPLIES, HttpFrontend, InferReplies, error_reply
from ..restrictions import Restriction, http_refusal, unmet
from .sagemaker import post_infer

log = logging.getLogger("mini_triton.vertex_ai")

BINARY_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT_HEADER = "x-vertex-ai-triton-redirect"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_INFER = re.compile(r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+))?/infer")
# The v2 routes a redirect may reach, each with the method its handler expects (Triton's
# table: inference, shared-memory changes and the repository API keep POST).
_REDIRECTS = (
    (re.compile(r"/v2/models/stats"), "GET"),
    (re.compile(r"/v2/models/[^/]+(?:/versions/[0-9]+)?(?:/(?:ready|config|stats))?"), "GET"),
    (re.compile(r"/v2(?:/health/(?:live|ready))?"), "GET"),
    (re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?/status"), "GET"),
    (re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?/(?:register|unregister)"),
     "POST"),
    (re.compile(r"/v2/repository(?:/[^/]+)?/(?:index|models/[^/]+/(?:load|unload))"), "POST"),
)


# The v2 API's replies, never compressed (Triton's Vertex AI server sends identity only).
REPLIES = InferReplies(V2_REPLIES.error, V2_REPLIES.binary_headers, compressible=False)


@dataclass
class VertexSettings:
    """What `--allow-vertex-ai` serves, and where (tritonserver's flags and the AIP_*
    variables Vertex AI sets)."""

    port: int = 8080  # --vertex-ai-port, else AIP_HTTP_PORT
    address: str = "0.0.0.0"
    default_model: str = ""  # --vertex-ai-default-model
    predict_route: str = ""  # AIP_PREDICT_ROUTE
    health_route: str = ""  # AIP_HEALTH_ROUTE


def check_routes(settings: VertexSettings) -> None:
    """Both routes must be set (INVALID_ARG naming the variable, as Triton)."""
    if not settings.predict_route:
        raise invalid_arg("AIP_PREDICT_ROUTE is not defined for Vertex AI endpoint")
    if not settings.health_route:
        raise invalid_arg("AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint")


def default_model(service: InferenceService, wanted: str) -> str:
    """The model the predict route serves: `wanted`, which must be ready, or the one
    ready model when none is named (INVALID_ARG otherwise, as Triton at start-up)."""
    ready = [entry["name"] for entry in service.repository_index(ready_only=True)]
    if not wanted:
        if len(set(ready)) != 1:
            raise invalid_arg("Expect the model repository contains only a single model if "
                              "default model is not specified")
        return ready[0]
    if wanted not in ready:
        raise invalid_arg(f"Expect the default model '{wanted}' is loaded")
    return wanted


class VertexFrontend:
    """The Vertex AI port's App: `handle(request, exchange)`."""

    def __init__(self, service: InferenceService, settings: VertexSettings, model: str,
                 restricted: dict[str, Restriction] | None = None):
        self.service = service
        self.settings = settings
        self.model = model
        self.restricted = restricted or {}  # --http-restricted-api
        self.v2 = HttpFrontend(service, self.restricted, openai=False)

    def handle(self, request: HttpRequest, exchange: Exchange) -> None:
        log.debug("Vertex AI request: %s %s", request.method, request.path)
        if request.path == self.settings.health_route:
            if self._allowed("health", request, exchange):
                exchange.run(self.health, request)
        elif request.path == self.settings.predict_route:
            redirect = request.headers.get(REDIRECT_HEADER)
            if redirect is None:
                self._infer(request, exchange, self.model, "")
            elif request.method != "POST":
                exchange.answer(HttpReply(405))
            else:
                self._redirect(request, exchange, "/" + redirect)
        else:
            exchange.answer(HttpReply(400))

    async def health(self, request: HttpRequest) -> HttpReply:
        if request.method != "GET":
            return error_reply(405, "Method Not Allowed")
        return HttpReply(200 if await self.service.check_ready() else 400)

    async def _metrics(self, request: HttpRequest) -> HttpReply:
        text = await self.service.ask("metrics_text")
        return HttpReply(200, text.encode(), METRICS_CONTENT_TYPE)

    def _allowed(self, group: str, request: HttpRequest, exchange: Exchange) -> bool:
        """Whether the request meets `group`'s restriction; if not, it is answered 403
        as the HTTP port answers it."""
        restriction = unmet(self.restricted, group, request.headers)
        if restriction is not None:
            exchange.answer(error_reply(403, http_refusal(restriction)))
        return restriction is None

    def _infer(self, request: HttpRequest, exchange: Exchange, model: str,
               version: str) -> None:
        if not self._allowed("inference", request, exchange):
            return
        post_infer(self.v2, request, exchange, model, version, REPLIES, BINARY_MIME)

    def _redirect(self, request: HttpRequest, exchange: Exchange, path: str) -> None:
        log.debug("Redirecting Vertex AI request: %s", path)
        if path == "/metrics":
            exchange.run(self._metrics, request)
            return
        infer = _INFER.fullmatch(path)
        if infer is not None:
            self._infer(request, exchange, infer["model"], infer["version"] or "")
            return
        method = next((m for pattern, m in _REDIRECTS if pattern.fullmatch(path)), None)
        if method is None:
            exchange.answer(HttpReply(400))
            return
        request.method, request.path = method, path
        self.v2.handle(request, exchange)
