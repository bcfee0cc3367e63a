"""The SageMaker front end (`--allow-sagemaker`): the routes of Triton's
sagemaker_server.cc on a port of its own.

- `GET /ping`: 200 when the server is ready (or live, SAGEMAKER_TRITON_PING_MODE=live),
  else 400.
- `POST /invocations`: inference on the endpoint's one model.
- Multi-model endpoints: `GET /models`, `POST /models` (load `{"model_name", "url"}`),
  `GET /models/NAME`, `DELETE /models/NAME`, `POST /models/NAME/invoke`.

A request body's JSON header length travels in the content type
(`application/vnd.sagemaker-triton.binary+json;json-header-size=N`), and so does the
reply's. Inference runs through the v2 front end's `start_infer`; model control through
the service.

`--http-restricted-api` holds here as on the HTTP port (tritonserver 2.51 leaves the
SageMaker port open): `/ping` is "health", `/invocations` and invoke "inference", the
other multi-model routes "model-repository". `DELETE /models/NAME` unloads only a model
that this port loaded, whatever the target-model header names.

The models this port loaded are the service's (`sagemaker_model*`, asked): one table for
the server, so that with front-end processes a model loaded through one is listed,
invoked and unloaded through any.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ...config import MAX_CONFIG_BYTES
from ...core.errors import Code, TritonError, invalid_arg
from ...core.files import read_regular
from ...core.names import printable
from ...service import InferenceService
from ..errors import http_status
from ..http1.exchange import Exchange, HttpReply, HttpRequest
from ..kserve_rest.http_codec import loads_body
from ..kserve_rest.server import HttpFrontend, InferReplies, error_reply, json_reply
from ..restrictions import Restriction, http_refusal, unmet

log = logging.getLogger("mini_triton.sagemaker")

BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
TARGET_MODEL_HEADER = "x-amzn-sagemaker-target-model"
UNSPECIFIED_MODEL = "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"  # Triton's default

_MODELS = re.compile(r"/models(?:/)?([^/]+)?(/invoke)?")
_ENSEMBLE = re.compile(r'platform:\s*"ensemble"')
# Words of a failed load or inference that mean memory ran out: SageMaker moves the
# model elsewhere on a 507 (Triton's list).
_OUT_OF_MEMORY = (
    "CUDA out of memory", "CUDA_OUT_OF_MEMORY", "Out of memory", "Out Of Memory",
    "out of memory", "MemoryError", "OutOfMemory", "OOM", "Dst tensor is not initialized",
    "Src tensor is not initialized", "CNMEM_STATUS_OUT_OF_MEMORY",
    "CUDNN_STATUS_NOT_INITIALIZED", "CUBLAS_STATUS_ALLOC_FAILED",
    "CUBLAS_STATUS_NOT_INITIALIZED", "Failed to allocate memory", "failed to allocate memory",
    "No space left on device")


@dataclass
class SagemakerSettings:
    """What `--allow-sagemaker` serves, and where (tritonserver's flags and the
    variables Triton's SageMaker container reads)."""

    port: int = 8080  # --sagemaker-port, else SAGEMAKER_BIND_TO_PORT
    address: str = "0.0.0.0"
    safe_port_range: tuple[int, int] | None = None  # --sagemaker-safe-port-range
    ping_mode: str = "ready"  # SAGEMAKER_TRITON_PING_MODE: ready or live
    default_model: str | None = None  # SAGEMAKER_TRITON_DEFAULT_MODEL_NAME


def binary_headers(json_length: int | None) -> tuple[str, dict[str, str]]:
    """A reply's content type: the JSON header's length rides in it."""
    if json_length is None:
        return "application/json", {}
    return f"{BINARY_MIME}{json_length}", {}


def out_of_memory(message: str) -> bool:
    return any(words in message for words in _OUT_OF_MEMORY)


def _mme_error(error: TritonError) -> HttpReply:
    """Errors of the multi-model routes: 507 when memory ran out, else 400."""
    return error_reply(507 if out_of_memory(error.message) else 400, error.message)


# /invocations answers errors as the v2 API does; a multi-model invoke as SageMaker wants.
# Replies are never compressed (Triton's SageMaker server sends identity only).
INVOCATION_REPLIES = InferReplies(
    lambda error: error_reply(http_status(error.code), error.message), binary_headers,
    compressible=False)
MME_REPLIES = InferReplies(_mme_error, binary_headers, compressible=False)


def post_infer(v2: HttpFrontend, request: HttpRequest, exchange: Exchange, model: str,
               version: str, replies: InferReplies, mime: str) -> None:
    """An inference route of a cloud front end: POST only, the JSON header's length
    from the content type (`mime` plus the size), then the v2 inference itself."""
    if request.method != "POST":
        exchange.answer(error_reply(405, "Method Not Allowed"))
        return
    try:
        length = header_length(request.headers.get("content-type"), len(request.body), mime)
    except TritonError as error:
        exchange.answer(replies.error(error))
        return
    v2.start_infer(request, exchange, model, version, length, replies)


def header_length(content_type: str | None, body_length: int, mime: str) -> int | None:
    """The JSON header's length a content type declares (None: the whole body is
    JSON; 0: the body is the only input's raw data), with Triton's errors."""
    if content_type is None or mime not in content_type:
        return None
    if not content_type.startswith(mime):
        raise invalid_arg(f"expect MIME type for binary data starts with '{mime}', got: "
                          f"{content_type}")
    text = content_type[len(mime):].strip()
    if not (text.isascii() and text.isdigit()):  # atoi would read junk as 0 (raw input)
        raise invalid_arg(f"Unable to parse inference header size, got: {text}")
    length = int(text)
    if length > body_length:
        raise invalid_arg(f"inference header size should be in range (0, {body_length}), "
                          f"got: {text}")
    return length


def model_folder_of(url: str) -> tuple[str, str]:
    """(repository, subfolder) that a multi-model load's `url` names: `url` itself
    when it holds config.pbtxt (SageMaker's /opt/ml/models/HASH/model), else the one
    model folder inside it, or its ensemble when it holds several. It reads the disk
    (a client names the folder): run it off the event loop."""
    folder = Path(url)
    if (folder / "config.pbtxt").is_file():
        return str(folder.parent), folder.name
    subfolders = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    ensembles = [p for p in subfolders if _is_ensemble(p)]
    if ensembles:
        return url, ensembles[0].name
    if len(subfolders) == 1:
        return url, subfolders[0].name
    if not subfolders:
        raise invalid_arg(f"failed to register '{url}', repository not found")
    raise invalid_arg(f"'{url}' holds {len(subfolders)} model folders and none is an "
                      "ensemble: expected one model, or an ensemble and its steps")


def _is_ensemble(folder: Path) -> bool:
    """Whether the folder's config names the ensemble platform; a config that cannot be
    read (not a regular file, too large) is not one, and its load says why."""
    try:
        text = read_regular(folder / "config.pbtxt", MAX_CONFIG_BYTES)
    except OSError:
        return False
    return bool(_ENSEMBLE.search(text.decode("utf-8", "replace")))


class _LoadedModel(NamedTuple):
    """A model this port loaded, as the service keeps it (sagemaker_model)."""

    url: str  # the repository registered for it, as SageMaker's list shows it
    target: str  # the model's name in the server


class SagemakerFrontend:
    """The SageMaker port's App: `handle(request, exchange)`."""

    def __init__(self, service: InferenceService, settings: SagemakerSettings,
                 default_model: str, restricted: dict[str, Restriction] | None = None):
        self.service = service
        self.settings = settings
        self.default_model = default_model
        self.restricted = restricted or {}  # --http-restricted-api
        self.v2 = HttpFrontend(service, openai=False)

    def handle(self, request: HttpRequest, exchange: Exchange) -> None:
        log.debug("SageMaker request: %s %s", request.method, request.path)
        match = _MODELS.fullmatch(request.path)
        group = _group(request.path, match)
        if group is None:
            exchange.answer(HttpReply(400))
            return
        restriction = unmet(self.restricted, group, request.headers)
        if restriction is not None:
            exchange.answer(error_reply(403, http_refusal(restriction)))
        elif request.path == "/ping":
            exchange.run(self.ping, request)
        elif request.path == "/invocations":
            self.invoke(request, exchange, self.default_model, INVOCATION_REPLIES)
        else:
            self._multi_model(request, exchange, match.group(1) or "", match.group(2))

    def _multi_model(self, request: HttpRequest, exchange: Exchange, name: str,
                     invoke: str | None) -> None:
        method = request.method
        if method == "GET":
            exchange.run(self.get_model if name else self.list_models, request)
        elif method == "POST" and invoke:
            exchange.spawn(self.invoke_loaded(request, exchange, name))
        elif method == "POST":  # the body names the model; a name in the path is ignored
            exchange.run(self.load_model, request)
        elif method == "DELETE":
            request.params = {"name": name}
            exchange.run(self.unload_model, request)
        else:
            exchange.answer(HttpReply(400))

    async def ping(self, request: HttpRequest) -> HttpReply:
        if request.method != "GET":
            return error_reply(405, "Method Not Allowed")
        if self.settings.ping_mode == "live":
            healthy = self.service.live()
        else:
            healthy = await self.service.check_ready()
        return HttpReply(200 if healthy else 400)

    def invoke(self, request: HttpRequest, exchange: Exchange, model: str,
               replies: InferReplies) -> None:
        post_infer(self.v2, request, exchange, model, "", replies, BINARY_MIME)

    async def invoke_loaded(self, request: HttpRequest, exchange: Exchange,
                            name: str) -> None:
        """`POST /models/NAME/invoke`: 404 unless this port loaded NAME (through any
        front-end process), else inference on the target model."""
        if await self._loaded(name) is None:
            exchange.answer(HttpReply(404))
            return
        target = request.headers.get(TARGET_MODEL_HEADER, name)
        log.info("Invoking SageMaker TargetModel: %s", target)
        self.invoke(request, exchange, target, MME_REPLIES)

    async def _loaded(self, name: str) -> _LoadedModel | None:
        loaded = await self.service.ask("sagemaker_model", name)
        return None if loaded is None else _LoadedModel(*loaded)

    # --- multi-model endpoints ---

    async def list_models(self, request: HttpRequest) -> HttpReply:
        """The loaded models that are ready (Triton lists an empty object for one that
        is not; we leave it out)."""
        loaded = await self.service.ask("sagemaker_models")
        models = [{"modelName": name, "modelUrl": url}
                  for name, (url, target) in loaded.items()
                  if await self.service.ask("model_ready", target)]
        return json_reply({"models": models})

    async def get_model(self, request: HttpRequest) -> HttpReply:
        name = _MODELS.fullmatch(request.path).group(1)
        model = await self._loaded(name)
        if model is None:
            return HttpReply(404)
        return json_reply({"modelName": name, "modelUrl": model.url})

    async def load_model(self, request: HttpRequest) -> HttpReply:
        """Register the model's folder and load it under its target name: 200, 409 when
        the name is taken, 507 when memory ran out, else 400."""
        try:
            name, url = await self.v2.decoder.decode(request.body, _load_request, request.body)
            repository, subfolder = await asyncio.get_running_loop().run_in_executor(
                None, model_folder_of, url)
        except TritonError as error:
            return error_reply(400, error.message)
        target = request.headers.get(TARGET_MODEL_HEADER, name)
        log.info("Loading SageMaker TargetModel: %s", target)
        try:
            await self.service.register_model_repository(repository, {target: subfolder})
        except TritonError as error:
            status = 409 if error.code == Code.ALREADY_EXISTS else 400
            return error_reply(status, error.message)
        try:
            await self.service.load_model(target)
        except TritonError as error:
            await self._unregister_quietly(repository)
            if error.code == Code.ALREADY_EXISTS:
                return error_reply(409, error.message)
            return _mme_error(error)
        await self.service.ask("sagemaker_model_add", name, repository, target)
        return HttpReply(200)

    async def unload_model(self, request: HttpRequest) -> HttpReply:
        """Unload the model this port loaded as NAME (never another: the target-model
        header may only name the same model), then unregister its folder."""
        name = request.params["name"]
        model = await self._loaded(name)
        if model is None:
            return HttpReply(404)
        target = request.headers.get(TARGET_MODEL_HEADER, model.target)
        if target != model.target:
            return error_reply(400, f"'{name}' was loaded as '{model.target}', not as "
                                    f"'{printable(target)}'")
        log.info("Unloading SageMaker TargetModel: %s", target)
        try:
            await self.service.unload_model(target, unload_dependents=True)
        except TritonError as error:
            return error_reply(400, error.message)
        if await self.service.ask("sagemaker_model_remove", name) is None:
            return HttpReply(404)  # a DELETE beside this one unregisters the folder
        try:
            await self.service.unregister_model_repository(model.url)
        except TritonError as error:
            return error_reply(400, error.message)
        return HttpReply(200)

    async def _unregister_quietly(self, repository: str) -> None:
        try:
            await self.service.unregister_model_repository(repository)
        except TritonError as error:
            log.warning("cannot unregister '%s' after a failed load: %s", repository,
                        error.message)


def _group(path: str, models_match) -> str | None:
    """The API group of a route of this port (None: no such route)."""
    if path == "/ping":
        return "health"
    if path == "/invocations" or (models_match is not None and models_match.group(2)):
        return "inference"
    return "model-repository" if models_match is not None else None


def _load_request(body: bytes) -> tuple[str, str]:
    """(model_name, url) of a load request, with Triton's errors."""
    if not body:
        return "", ""
    try:
        document = loads_body(body)
    except ValueError as error:
        raise invalid_arg(f"failed to parse the request JSON buffer: {error}") from None
    if not isinstance(document, dict):
        raise invalid_arg("the request body must be a JSON object")
    fields = []
    for key in ("model_name", "url"):
        value = document.get(key, "")
        if not isinstance(value, str):
            raise invalid_arg(f"'{key}' must be a string")
        fields.append(value)
    return fields[0], fields[1]
