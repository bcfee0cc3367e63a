"""text_stream: a deterministic reply, streamed word by word, behind the vLLM backend's
input/output contract (text_input, stream, sampling_parameters, exclude_input_in_output,
return_* → text_output, finish_reason, num_input_tokens, num_output_tokens).

The "language model" is a table of which word follows which in a short built-in text.
The reply starts from the prompt's last word when the table knows it (else from a
sentence start chosen by the prompt) and follows the table: greedily at temperature 0
(the default), or drawn with the request's seed otherwise, so one request always gets
the same reply. A sentence's end is the end of the reply ("stop") unless ignore_eos is
set; max_tokens (default 16) ends it with "length"; a stop string ends it before the
stop string. Each request streams from a thread of its own, so execute returns at once.

token_interval_ms (the time between two words) is bounded by max_token_interval_ms
(default 1000): a request asking for more is refused. Between two words the thread
waits on an event that finalize sets, asking now and then whether the request was
cancelled, so a client that left or an unload ends it within a fraction of a second.
"""

import collections
import json
import math
import threading
import time
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

TEXT = """
the server streams every word to the client as soon as the model has made it .
a client reads the stream one event at a time and shows each word when it comes .
the model answers many requests at once and each request gets a reply of its own .
every reply starts with one word and grows until it reaches its end or its limit .
a slow client reads its stream at its own pace and the server waits for it .
when a client goes away the server cancels its request and the model stops .
the scheduler sends each request to the model and the model sends back its words .
a stop word ends the reply before the stop word itself is sent .
"""
END = "."
DEFAULT_MAX_TOKENS = 16
DEFAULT_MAX_TOKEN_INTERVAL_MS = 1000.0
CANCEL_CHECK_S = 0.1  # a long wait asks this often whether its request was cancelled
FINALIZE_WAIT_S = 5.0  # for all the answering threads together


def count_followers(text):
    """word → how often each word follows it."""
    words = text.split()
    followers = collections.defaultdict(collections.Counter)
    for word, following in zip(words, words[1:]):
        followers[word][following] += 1
    return dict(followers)


COUNTS = count_followers(TEXT)
# word → its followers, most frequent first (ties in order of appearance)
TABLE = {word: [w for w, _ in counts.most_common()] for word, counts in COUNTS.items()}
STARTS = TABLE[END]  # words that begin a sentence


class Generation:
    """One reply: the words it has made and why it ended."""

    def __init__(self, prompt, params):
        self.max_tokens = int(params.get("max_tokens") or DEFAULT_MAX_TOKENS)
        self.temperature = float(params.get("temperature") or 0.0)
        self.ignore_eos = bool(params.get("ignore_eos", False))
        stop = params.get("stop") or []
        self.stops = [stop] if isinstance(stop, str) else [s for s in stop if s]
        seed = params.get("seed")
        key = f"{seed if seed is not None else 0}:{prompt}".encode("utf-8")
        self.state = zlib.crc32(key)
        words = prompt.lower().split()
        last = words[-1].strip(",;:!?\"'") if words else ""
        self.word = last if last in TABLE else None
        self.tokens = 0
        self.text = ""  # made so far (the whole reply, before stop strings apply)
        self.finish_reason = None

    def _random(self):
        # A 32-bit linear congruential step: the same sequence on every platform.
        self.state = (self.state * 1664525 + 1013904223) & 0xFFFFFFFF
        return self.state / 2**32

    def _next_word(self):
        if self.word is None:  # a sentence start, chosen by the prompt and seed
            return STARTS[int(self._random() * len(STARTS))]
        choices = TABLE[self.word]
        if not self.temperature or len(choices) == 1:
            return choices[0]
        weights = [COUNTS[self.word][w] ** (1.0 / self.temperature) for w in choices]
        point = self._random() * sum(weights)
        for word, weight in zip(choices, weights):
            point -= weight
            if point <= 0:
                return word
        return choices[-1]

    def step(self):
        """The text of the next token ("" once the reply has ended)."""
        if self.finish_reason is not None:
            return ""
        if self.tokens >= self.max_tokens:
            self.finish_reason = "length"
            return ""
        word = self._next_word()
        self.word = word
        self.tokens += 1
        piece = word if word == END or not self.text else " " + word
        self.text += piece
        if word == END and not self.ignore_eos:
            self.finish_reason = "stop"
        elif self.tokens >= self.max_tokens:
            self.finish_reason = "length"
        return piece


class StopFilter:
    """Holds back text that may be the start of a stop string; cuts at one."""

    def __init__(self, stops):
        self.stops = stops
        self.held = ""

    def feed(self, piece):
        """(text that can be sent now, whether a stop string was found)."""
        self.held += piece
        found = [i for i in (self.held.find(s) for s in self.stops) if i >= 0]
        if found:
            text, self.held = self.held[:min(found)], ""
            return text, True
        keep = max((k for s in self.stops for k in range(1, len(s))
                    if self.held.endswith(s[:k])), default=0)
        text = self.held[:len(self.held) - keep]
        self.held = self.held[len(self.held) - keep:]
        return text, False

    def flush(self):
        text, self.held = self.held, ""
        return text


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
            raise pb_utils.TritonModelException("text_stream needs the decoupled policy")
        parameters = self.model_config.get("parameters", {})

        def parameter(key, default):
            return parameters.get(key, {}).get("string_value") or default

        self.max_interval_ms = _milliseconds("max_token_interval_ms", parameter(
            "max_token_interval_ms", DEFAULT_MAX_TOKEN_INTERVAL_MS), math.inf)
        self.interval_ms = _milliseconds("token_interval_ms",
                                         parameter("token_interval_ms", 0),
                                         self.max_interval_ms)
        self.stopping = threading.Event()  # set by finalize: every wait ends
        family = pb_utils.MetricFamily(
            name="text_stream_cancelled_requests",
            description="Requests of text_stream that stopped because they were cancelled",
            kind=pb_utils.MetricFamily.COUNTER)
        self.cancelled = family.Metric(labels={"model": args["model_name"]})
        self.lock = threading.Lock()
        self.threads = set()

    def execute(self, requests):
        for request in requests:
            thread = threading.Thread(target=self.answer, args=(request,), daemon=True)
            with self.lock:
                self.threads.add(thread)
            thread.start()
        return None

    def answer(self, request):
        sender = request.get_response_sender()
        try:
            self.generate(request, sender)
        except ValueError as error:  # a bad request is the client's: say why, and end
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                str(error), pb_utils.TritonError.INVALID_ARG)),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as error:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    def generate(self, request, sender):
        prompt = _string(request, "text_input")
        stream = _flag(request, "stream", False)
        exclude = pb_utils.get_input_tensor_by_name(request, "exclude_input_in_output")
        prepend = (not bool(exclude.as_numpy().reshape(-1)[0])) if exclude is not None \
            else not stream
        if prepend and stream:
            raise ValueError("When streaming, `exclude_input_in_output` = False is not allowed.")
        params = _sampling_parameters(request)
        interval = _milliseconds("token_interval_ms",
                                 params.get("token_interval_ms", self.interval_ms),
                                 self.max_interval_ms) / 1000.0
        wanted = {name: _flag(request, name, False) for name in
                  ("return_finish_reason", "return_num_input_tokens", "return_num_output_tokens")}
        generation = Generation(prompt, params)
        stops = StopFilter(generation.stops)
        reply = Reply(sender, wanted, len(prompt.split()), prompt if prepend else "")
        while generation.finish_reason is None:
            if not self.wait(interval, sender):
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "text_stream is being unloaded", pb_utils.TritonError.UNAVAILABLE)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            if sender.is_cancelled():
                self.cancelled.increment(1)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            text, stopped = stops.feed(generation.step())
            if stopped:
                generation.finish_reason = "stop"
            done = generation.finish_reason is not None
            if done:
                text += "" if stopped else stops.flush()
            if stream:
                reply.send(text, 1, generation.finish_reason, final=done)
            else:
                reply.add(text)
        if not stream:
            reply.send("", generation.tokens, generation.finish_reason, final=True)

    def wait(self, seconds, sender):
        """Wait up to `seconds` before the next word, less if the request is cancelled
        meanwhile; False when the model is finalizing."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            if self.stopping.wait(min(left, CANCEL_CHECK_S)):
                return False
            if left > CANCEL_CHECK_S and sender.is_cancelled():
                return True  # the caller sees it cancelled

    def finalize(self):
        self.stopping.set()
        with self.lock:
            threads = list(self.threads)
        deadline = time.monotonic() + FINALIZE_WAIT_S
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


class Reply:
    """Sends a request's responses in the vLLM backend's shape."""

    def __init__(self, sender, wanted, input_tokens, prefix):
        self.sender = sender
        self.wanted = wanted
        self.input_tokens = input_tokens
        self.pending = prefix  # the prompt, when it goes before the reply
        self.tokens = 0  # tokens made since the last response

    def add(self, text):
        self.pending += text

    def send(self, text, tokens, finish_reason, final):
        text, self.pending = self.pending + text, ""
        tokens, self.tokens = self.tokens + tokens, 0
        if not text and not final:
            self.tokens = tokens  # nothing to say yet (held for a stop string)
            return
        outputs = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], np.object_))]
        if self.wanted["return_finish_reason"]:
            outputs.append(pb_utils.Tensor("finish_reason",
                                           np.array([str(finish_reason)], np.object_)))
        if self.wanted["return_num_input_tokens"]:
            outputs.append(pb_utils.Tensor("num_input_tokens",
                                           np.array([self.input_tokens], np.uint32)))
        if self.wanted["return_num_output_tokens"]:
            outputs.append(pb_utils.Tensor("num_output_tokens", np.array([tokens], np.uint32)))
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        self.sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=flags)


def _string(request, name):
    value = pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _flag(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return bool(tensor.as_numpy().reshape(-1)[0]) if tensor is not None else default


def _milliseconds(name, value, limit):
    """A duration parameter in milliseconds, from 0 to `limit`; ValueError naming it."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of milliseconds, not {value!r}") from None
    if not 0 <= number <= limit:
        raise ValueError(f"{name} must be from 0 to {limit:g} milliseconds "
                         f"(max_token_interval_ms), not {value!r}")
    return number


def _sampling_parameters(request):
    """From the sampling_parameters input (JSON), else the request parameters, as the
    vLLM backend reads them."""
    tensor = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
    text = _string(request, "sampling_parameters") if tensor is not None \
        else request.parameters()
    try:
        params = json.loads(text or "{}")
    except ValueError:
        raise ValueError("sampling_parameters must be a JSON object") from None
    if not isinstance(params, dict):
        raise ValueError("sampling_parameters must be a JSON object")
    return params
