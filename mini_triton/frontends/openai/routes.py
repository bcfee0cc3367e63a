"""An OpenAI-compatible front door on the HTTP port: `GET /v1/models`,
`GET /v1/models/NAME`, `POST /v1/completions` and `POST /v1/chat/completions`, whole
or streamed (`stream: true`: `data:` chunks, then `data: [DONE]`).

Each choice (`n` of them per prompt) is one request of the model through the service,
as any other request: counted in statistics and metrics, through ensembles and BLS
alike; a client that goes away cancels them all. Refusals are OpenAI error objects
(`{"error": {"message", "type", "param", "code"}}`) with a 4xx status; an error after
a stream began is a `data: {"error": ...}` event, then `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from ... import SERVER_NAME
from ...core.errors import Code, TritonError
from ...service import InferenceService
from ..errors import http_status
from ..http1.exchange import BodyStream, Exchange, HttpReply, HttpRequest
from ..http1.limits import DEFAULT_STREAM_MAX_QUEUED_BYTES, STREAM_LIMIT_FLAG
from ..http1.offload import BodyDecoder
from ..kserve_rest import generate, http_codec
from ..kserve_rest.generate_routes import EVENT_STREAM, STREAM_HEADERS
from . import chat_template, codec
from .codec import OpenAIError

log = logging.getLogger("mini_triton.openai")

DONE = b"data: [DONE]\n\n"


def error_reply(status: int, message: str, code: str | None = None) -> HttpReply:
    return HttpReply(status, codec.error_body(status, message, code))


class OpenAIRoutes:
    def __init__(self, service: InferenceService,
                 stream_limit: int = DEFAULT_STREAM_MAX_QUEUED_BYTES,
                 decoder: BodyDecoder | None = None):
        self.service = service
        self.stream_limit = stream_limit  # responses waiting for the client, in bytes
        self.decoder = decoder or BodyDecoder()  # a large body is decoded off the loop
        self._created: dict[str, int] = {}  # model → when /v1 first saw it ready
        self._templates: dict[str, tuple] = {}  # model → (its config, its ChatTemplate)

    def routes(self) -> list[tuple]:
        """(API group, method, path, handler), groups as Triton's OpenAI front end has
        them for --http-restricted-api."""
        return [
            ("model-repository", "GET", "/v1/models", self.list_models),
            ("model-repository", "GET", "/v1/models/{model}", self.retrieve_model),
            ("inference", "POST", "/v1/completions", self.completions),
            ("inference", "POST", "/v1/chat/completions", self.chat_completions),
        ]

    @staticmethod
    def refusal(status: int, message: str) -> HttpReply:
        return error_reply(status, message)

    # --- models ---

    def list_models(self, request: HttpRequest, exchange: Exchange) -> None:
        exchange.run(self._list_models, request)

    def retrieve_model(self, request: HttpRequest, exchange: Exchange) -> None:
        exchange.run(self._retrieve_model, request)

    async def _list_models(self, request: HttpRequest) -> HttpReply:
        index = await self.service.ask("repository_index", True)  # the ready ones
        names = sorted({entry["name"] for entry in index})
        data = [self._model_object(name) for name in names if await self._serves(name)]
        return HttpReply(200, _dumps({"object": "list", "data": data}))

    async def _retrieve_model(self, request: HttpRequest) -> HttpReply:
        name = request.params["model"]
        try:
            await self._contract(name)
        except OpenAIError as error:
            return error_reply(error.status, error.message, error.code)
        return HttpReply(200, _dumps(self._model_object(name)))

    def _model_object(self, name: str) -> dict:
        created = self._created.setdefault(name, int(time.time()))
        return {"id": name, "object": "model", "created": created, "owned_by": SERVER_NAME}

    async def _serves(self, name: str) -> bool:
        try:
            config = await self.service.ask("model_config", name)
        except TritonError:
            return False
        return codec.contract_of(config) is not None

    async def _contract(self, name: str) -> codec.Contract:
        try:
            config = await self.service.ask("model_config", name)
        except TritonError as error:
            if error.code == Code.NOT_FOUND:
                raise OpenAIError(404, f"The model '{name}' does not exist",
                                  "model_not_found") from None
            raise OpenAIError(http_status(error.code), error.message) from None
        contract = codec.contract_of(config)
        if contract is None:
            raise codec.no_contract(name)
        return contract

    # --- completions ---

    def completions(self, request: HttpRequest, exchange: Exchange) -> None:
        exchange.run(lambda r: self._serve(r, exchange, chat=False), request)

    def chat_completions(self, request: HttpRequest, exchange: Exchange) -> None:
        exchange.run(lambda r: self._serve(r, exchange, chat=True), request)

    async def _serve(self, request: HttpRequest, exchange: Exchange, chat: bool):
        try:
            ask, contract = await self._ask(request.body, chat)
            runs = await self._start(ask, contract)
        except OpenAIError as error:
            return error_reply(error.status, error.message, error.code)
        except TritonError as error:
            return error_reply(http_status(error.code), error.message)
        if ask.stream:
            await self._stream(ask, runs, exchange)
            return None
        return await self._whole(ask, runs)

    async def _ask(self, body: bytes, chat: bool) -> tuple[codec.Ask, codec.Contract]:
        """The request's fields, its model's contract and (chat) the prompt rendered
        from its messages; the work in proportion to the body's size is done off the
        loop for a large body."""
        document, ask = await self.decoder.decode(body, _parsed, body, chat)
        contract = await self._contract(ask.model)
        if chat:
            template = await self._template(ask.model)
            ask.prompts = [await self.decoder.decode(body, _prompt, template,
                                                     document["messages"])]
        return ask, contract

    async def _template(self, model: str):
        """The model's chat template (looked for again once the model is reloaded)."""
        config = await self.service.ask("model_config", model)
        cached = self._templates.get(model)
        if cached is not None and cached[0] is config:
            return cached[1]
        template = chat_template.find_template(await self._folders(model))
        self._templates[model] = (config, template)
        return template

    async def _folders(self, model: str) -> list:
        """Where a model's tokenizer config may be: its version folder, then its own."""
        try:
            folder, version = await self.service.ask("model_folder", model)
        except TritonError:
            return []
        return [] if folder is None else [folder / str(version), folder]

    async def _start(self, ask: codec.Ask, contract: codec.Contract) -> list:
        """Start every choice: [(InferenceRequest, ResponseStream)]; if one is refused,
        those already started are cancelled."""
        runs = []
        try:
            for prompt_index, prompt in enumerate(ask.prompts):
                for j in range(ask.n):
                    infer_request = codec.model_request(ask, contract, prompt,
                                                        prompt_index * ask.n + j)
                    runs.append((infer_request, await self.service.start_stream(
                        infer_request, self.stream_limit, STREAM_LIMIT_FLAG)))
        except (OpenAIError, TritonError):
            self._cancel(runs)
            raise
        return runs

    def _cancel(self, runs: list) -> None:
        for infer_request, _ in runs:
            if not infer_request.completed:
                self.service.cancel(infer_request)

    async def _whole(self, ask: codec.Ask, runs: list) -> HttpReply:
        choices = [codec.Choice(index) for index in range(len(runs))]
        try:
            async with contextlib.aclosing(_merged([s for _, s in runs])) as responses:
                async for index, response in responses:
                    if response.error is not None:
                        self._cancel(runs)
                        return error_reply(_status(response.error), response.error.message)
                    if not response.empty:
                        choices[index].add(response)
        except asyncio.CancelledError:
            self._cancel(runs)
            raise
        return HttpReply(200, codec.Reply(ask).whole(choices), compressible=True)

    async def _stream(self, ask: codec.Ask, runs: list, exchange: Exchange) -> None:
        body = exchange.begin_stream(200, EVENT_STREAM, STREAM_HEADERS)
        try:
            if await self._stream_choices(ask, runs, body):
                await body.send(DONE)
            else:
                self._cancel(runs)  # the client is gone
        except BaseException:  # cancelled (the client is gone), or a bug: stop the work
            self._cancel(runs)
            raise
        finally:
            body.end()

    async def _stream_choices(self, ask: codec.Ask, runs: list, body: BodyStream) -> bool:
        """The chunks of every choice as they come, each choice's finish chunk after its
        last response, then usage when asked; False once the client is gone."""
        reply = codec.Reply(ask)
        choices = [codec.Choice(index) for index in range(len(runs))]
        if ask.chat:
            for choice in choices:
                if not await body.send(generate.event(reply.chunk(choice.index, role=True))):
                    return False
        async with contextlib.aclosing(_merged([s for _, s in runs])) as responses:
            async for index, response in responses:
                if response.error is not None:
                    self._cancel(runs)
                    error = codec.error_body(_status(response.error), response.error.message)
                    return await body.send(generate.event(error))
                text = "" if response.empty else choices[index].add(response)
                if text and not await body.send(generate.event(reply.chunk(index, text))):
                    return False
                if response.final:
                    end = reply.chunk(index, finish_reason=choices[index].reason(ask.max_tokens))
                    if not await body.send(generate.event(end)):
                        return False
        if ask.include_usage:
            return await body.send(generate.event(reply.usage_chunk(choices)))
        return True


def _parsed(body: bytes, chat: bool) -> tuple[dict, codec.Ask]:
    """The request's JSON document and its fields."""
    document = codec.parse_body(body)
    return document, codec.parse_ask(document, chat)


def _prompt(template, messages: list) -> str:
    """The prompt `template` (None: the plain one) renders from the chat's messages."""
    messages = [{**m, "content": chat_template.text_of(m.get("content"))}
                for m in messages]
    return template.render(messages) if template is not None \
        else chat_template.plain_prompt(messages)


async def _merged(streams: list):
    """(choice index, response) from every stream as they come, each stream's in order."""
    if len(streams) == 1:
        async for response in streams[0]:
            yield 0, response
        return
    waiting = {asyncio.ensure_future(stream.next()): index
               for index, stream in enumerate(streams)}
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                index = waiting.pop(future)
                response = future.result()
                if not response.final:
                    waiting[asyncio.ensure_future(streams[index].next())] = index
                yield index, response
    finally:
        for future in waiting:
            future.cancel()


def _status(error: TritonError) -> int:
    return http_status(error.code)


def _dumps(document) -> bytes:
    return http_codec.dumps(document)
