"""The OpenAI wire format ⇄ requests of LLM-style models. Pure translation: no I/O.

A model is served through `/v1` when it follows one of the contracts Triton's own
OpenAI front end (`python/openai` in triton-inference-server/server) drives:

- vLLM-style: a BYTES input `text_input` and a BYTES input `sampling_parameters` (the
  sampling fields as JSON); optional BOOL inputs `stream`, `exclude_input_in_output`,
  `return_num_input_tokens`, `return_num_output_tokens`, `return_finish_reason`.
- TensorRT-LLM-style: `text_input` and an integer `max_tokens` input; optional `stream`,
  `stop_words`, `temperature`, `top_p`, `seed`, `frequency_penalty`,
  `presence_penalty`, the echo input and the `return_num_*` inputs.

Either gives its text as the BYTES output `text_output` (each response of a streaming
model carries the new text), and may report `num_input_tokens`, `num_output_tokens`
and `finish_reason`. Without those counts, usage counts whitespace-separated words.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from ...core.errors import TritonError
from ...core.request import InferenceRequest
from ..kserve_rest import generate, http_codec

DEFAULT_MAX_TOKENS = 16  # as Triton's OpenAI front end
MAX_CHOICES = 16  # `n` (times the prompts of one completions request) at most
MAX_STOP = 4
ROLES = ("system", "developer", "user", "assistant", "tool")
ECHO_INPUTS = ("exclude_input_in_output", "sampling_param_exclude_input_from_output")
RETURN_INPUTS = ("return_num_input_tokens", "return_num_output_tokens", "return_finish_reason")
# Fields of a request that are not sampling parameters (never passed to the model).
_NOT_SAMPLING = {"model", "prompt", "messages", "stream", "stream_options", "echo", "n",
                 "max_tokens", "max_completion_tokens", "user", "store", "metadata",
                 "service_tier", "parallel_tool_calls", "suffix", "logprobs",
                 "top_logprobs", "logit_bias", "tools", "tool_choice", "functions",
                 "function_call", "response_format", "best_of"}
_UNSUPPORTED = ("logprobs", "top_logprobs", "logit_bias", "suffix", "tools", "functions",
                "response_format")
# TensorRT-LLM-style inputs for OpenAI fields: (field, input name).
_TRTLLM_FIELDS = (("temperature", "temperature"), ("top_p", "top_p"), ("seed", "seed"),
                  ("frequency_penalty", "frequency_penalty"),
                  ("presence_penalty", "presence_penalty"), ("stop", "stop_words"))
# OpenAI's error types by HTTP status.
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "invalid_request_error",
                413: "invalid_request_error", 429: "rate_limit_error"}


class OpenAIError(Exception):
    """A request the OpenAI routes refuse: its status, message and error code."""

    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def error_body(status: int, message: str, code: str | None = None) -> bytes:
    return http_codec.dumps({"error": {"message": message,
                                       "type": _ERROR_TYPES.get(status, "api_error"),
                                       "param": None, "code": code}})


# --- the model contract ---


@dataclass(frozen=True)
class Contract:
    """How a model takes an OpenAI request: its style and its inputs."""

    style: str  # "vllm" or "trtllm"
    specs: dict  # input name → generate.InputSpec
    outputs: frozenset


def contract_of(config) -> Contract | None:
    """The contract `config` follows, or None."""
    specs = generate.input_specs(config)
    outputs = {o.name: o for o in config.output}
    text_in = specs.get("text_input")
    if text_in is None or text_in.datatype != "BYTES" or "text_output" not in outputs:
        return None
    sampling = specs.get("sampling_parameters")
    if sampling is not None and sampling.datatype == "BYTES":
        return Contract("vllm", specs, frozenset(outputs))
    if "max_tokens" in specs:
        return Contract("trtllm", specs, frozenset(outputs))
    return None


def no_contract(model: str) -> OpenAIError:
    return OpenAIError(400, f"model '{model}' does not take OpenAI requests: it needs a BYTES "
                            f"input 'text_input', a BYTES output 'text_output' and either a "
                            f"BYTES input 'sampling_parameters' (vLLM-style) or a "
                            f"'max_tokens' input (TensorRT-LLM-style)")


# --- requests ---


@dataclass
class Ask:
    """One completions or chat request, checked: what every choice runs with."""

    model: str
    chat: bool
    prompts: list[str] = field(default_factory=list)  # chat: one, from the messages
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    max_tokens: int = DEFAULT_MAX_TOKENS
    echo: bool | None = None
    sampling: dict = field(default_factory=dict)  # what goes to the model as sampling


def parse_body(body: bytes) -> dict:
    try:
        document = http_codec.loads_body(body) if body else None
    except ValueError as error:
        raise OpenAIError(400, f"the request body is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    return document


def parse_ask(document: dict, chat: bool) -> Ask:
    """The request's fields, checked as OpenAI documents them; messages are checked
    here and rendered later (they need the model's template)."""
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError(400, "you must provide a model parameter ('model', a string)")
    for name in _UNSUPPORTED:
        if document.get(name) not in (None, False, [], 0):
            raise OpenAIError(400, f"'{name}' is not supported")
    ask = Ask(model, chat)
    ask.stream = _typed(document, "stream", bool, False)
    options = document.get("stream_options")
    if options is not None:
        if not ask.stream:
            raise OpenAIError(400, "`stream_options` can only be used when `stream` is True")
        if not isinstance(options, dict):
            raise OpenAIError(400, "'stream_options' must be an object")
        ask.include_usage = _typed(options, "include_usage", bool, False)
    ask.n = _integer(document, "n", 1, 1, MAX_CHOICES)
    key = "max_completion_tokens" if chat and document.get("max_completion_tokens") is not None \
        else "max_tokens"
    ask.max_tokens = _integer(document, key, DEFAULT_MAX_TOKENS, 1, 2**31 - 1)
    if not chat:
        ask.prompts = _prompts(document.get("prompt"))
        if len(ask.prompts) * ask.n > MAX_CHOICES:
            raise OpenAIError(400, f"at most {MAX_CHOICES} choices per request (prompts × n)")
        echo = document.get("echo")
        if echo is not None and not isinstance(echo, bool):
            raise OpenAIError(400, "'echo' must be a boolean")
        ask.echo = echo
    else:
        check_messages(document.get("messages"))
    _check_sampling(document)
    ask.sampling = {k: v for k, v in document.items()
                    if k not in _NOT_SAMPLING and v is not None}
    if isinstance(ask.sampling.get("stop"), str):
        ask.sampling["stop"] = [ask.sampling["stop"]]
    return ask


def _typed(document: dict, name: str, kind: type, default):
    value = document.get(name)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise OpenAIError(400, f"'{name}' must be a {'boolean' if kind is bool else kind.__name__}")
    return value


def _integer(document: dict, name: str, default: int, low: int, high: int) -> int:
    value = document.get(name)
    if value is None:
        return default
    if type(value) is not int or not low <= value <= high:
        raise OpenAIError(400, f"'{name}' must be an integer from {low} to {high}")
    return value


def _number(document: dict, name: str, low: float, high: float) -> None:
    value = document.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not low <= value <= high:
        raise OpenAIError(400, f"'{name}' must be a number from {low:g} to {high:g}")


def _check_sampling(document: dict) -> None:
    _number(document, "temperature", 0, 2)
    _number(document, "top_p", 0, 1)
    _number(document, "frequency_penalty", -2, 2)
    _number(document, "presence_penalty", -2, 2)
    seed = document.get("seed")
    if seed is not None and (type(seed) is not int or not -2**63 <= seed < 2**64):
        raise OpenAIError(400, "'seed' must be an integer")
    stop = document.get("stop")
    if stop is None or isinstance(stop, str):
        return
    if not isinstance(stop, list) or len(stop) > MAX_STOP \
            or not all(isinstance(s, str) and s for s in stop):
        raise OpenAIError(400, f"'stop' must be a string or a list of up to {MAX_STOP} "
                               f"non-empty strings")


def _prompts(prompt) -> list[str]:
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = prompt
    else:
        raise OpenAIError(400, "'prompt' must be a string or a list of strings (token "
                               "arrays are not supported)")
    return prompts  # an empty prompt is taken, as OpenAI's API takes it (genai-perf sends some)


def check_messages(messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(400, "'messages' must be a non-empty list")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise OpenAIError(400, f"{where} must be an object with a 'role' among "
                                   f"{', '.join(ROLES)}")
        content = message.get("content")
        if content is None and message["role"] == "assistant":
            continue
        if isinstance(content, str):
            continue
        if not isinstance(content, list) or not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in content):
            raise OpenAIError(400, f"{where}.content must be a string or a list of text "
                                   f"parts (only text is supported)")


def model_request(ask: Ask, contract: Contract, prompt: str, choice: int) -> InferenceRequest:
    """The InferenceRequest for one choice of `ask`."""
    values = {"text_input": prompt}
    specs = contract.specs
    sampling = dict(ask.sampling)
    if choice and "seed" in sampling:  # choices of one request differ, reproducibly
        sampling["seed"] += choice
    if contract.style == "vllm":
        sampling["max_tokens"] = ask.max_tokens
        values["sampling_parameters"] = json.dumps(sampling)
    else:
        values["max_tokens"] = ask.max_tokens
        for name, input_name in _TRTLLM_FIELDS:
            if name in sampling:
                if input_name not in specs:
                    raise OpenAIError(400, f"model '{ask.model}' takes no '{name}' (it has "
                                           f"no input '{input_name}')")
                values[input_name] = sampling[name]
    if "stream" in specs:
        values["stream"] = ask.stream
    echo_input = next((name for name in ECHO_INPUTS if name in specs), None)
    if echo_input is not None and (ask.echo is not None or contract.style == "vllm"):
        values[echo_input] = not ask.echo
    for name in RETURN_INPUTS:
        if name in specs:
            values[name] = True
    request = InferenceRequest(ask.model)
    try:
        request.inputs = [generate.input_tensor(name, value, specs[name])
                          for name, value in values.items()]
    except TritonError as error:
        raise OpenAIError(400, error.message) from None
    return request


# --- responses ---


@dataclass
class Choice:
    """What one choice has produced so far."""

    index: int
    text: list[str] = field(default_factory=list)
    output_tokens: int | None = None  # as the model reported them
    input_tokens: int | None = None
    finish_reason: str | None = None

    def add(self, response) -> str:
        """Take one response of the model; the text it adds."""
        outputs = {t.name: t for t in response.outputs}
        text = _text(outputs.get("text_output"))
        self.text.append(text)
        count = _count(outputs.get("num_output_tokens"))
        if count is not None:
            self.output_tokens = (self.output_tokens or 0) + count
        if self.input_tokens is None:
            self.input_tokens = _count(outputs.get("num_input_tokens"))
        reason = _text(outputs.get("finish_reason"))
        if reason and reason.lower() != "none":
            self.finish_reason = reason
        return text

    def completion_tokens(self) -> int:
        if self.output_tokens is not None:
            return self.output_tokens
        return len("".join(self.text).split())

    def reason(self, max_tokens: int) -> str:
        if self.finish_reason:
            return self.finish_reason
        return "length" if self.completion_tokens() >= max_tokens else "stop"


def _text(tensor) -> str:
    if tensor is None:
        return ""
    return "".join(http_codec.array_to_json(tensor))


def _count(tensor) -> int | None:
    if tensor is None:
        return None
    values = http_codec.array_to_json(tensor)
    return int(sum(values)) if values else None


def usage(prompts: list[str], choices: list[Choice], n: int) -> dict:
    prompt_tokens = 0
    for index, prompt in enumerate(prompts):
        reported = choices[index * n].input_tokens
        prompt_tokens += reported if reported is not None else len(prompt.split())
    completion = sum(c.completion_tokens() for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


class Reply:
    """The identity of one reply (its id, time and model) and its documents."""

    def __init__(self, ask: Ask):
        self.ask = ask
        self.id = f"{'chatcmpl' if ask.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.object = "chat.completion" if ask.chat else "text_completion"

    def _document(self, object_name: str, choices: list) -> dict:
        return {"id": self.id, "object": object_name, "created": self.created,
                "model": self.ask.model, "system_fingerprint": None, "choices": choices}

    def whole(self, choices: list[Choice]) -> bytes:
        ask = self.ask
        entries = []
        for choice in choices:
            text = "".join(choice.text)
            entry = {"index": choice.index, "logprobs": None,
                     "finish_reason": choice.reason(ask.max_tokens)}
            if ask.chat:
                entry["message"] = {"role": "assistant", "content": text}
            else:
                entry["text"] = text
            entries.append(entry)
        document = self._document(self.object, entries)
        document["usage"] = usage(ask.prompts, choices, ask.n)
        return http_codec.dumps(document)

    def chunk(self, index: int, text: str | None = None, finish_reason: str | None = None,
              role: bool = False) -> bytes:
        """One streamed chunk: new text, or the choice's end, or (chat) its role."""
        entry = {"index": index, "logprobs": None, "finish_reason": finish_reason}
        if self.ask.chat:
            delta = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            entry["delta"] = delta
            return http_codec.dumps(self._document("chat.completion.chunk", [entry]))
        entry["text"] = text or ""
        return http_codec.dumps(self._document("text_completion", [entry]))

    def usage_chunk(self, choices: list[Choice]) -> bytes:
        object_name = "chat.completion.chunk" if self.ask.chat else "text_completion"
        document = self._document(object_name, [])
        document["usage"] = usage(self.ask.prompts, choices, self.ask.n)
        return http_codec.dumps(document)

