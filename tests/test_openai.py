"""The OpenAI-compatible front door (/v1) driven by the real `openai` client, streaming
and not, over the bundled text_stream (vLLM-style) and test models: a TensorRT-LLM-style
one and a vLLM-style one that answers with its prompt (with a chat template)."""

from __future__ import annotations

import json
import ssl

import httpx
import openai
import pytest

from conftest import server_settings, wait_for
from llm_models import write_repository
from mini_triton.frontends.restrictions import parse_restrictions
from mini_triton.server import ServerThread

CHAT = [{"role": "user", "content": "Tell me about the server"}]
QUICK = {"token_interval_ms": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = write_repository(tmp_path_factory.mktemp("openai"))
    with ServerThread(server_settings(repository)) as running:
        yield running


@pytest.fixture(scope="module")
def base(server):
    return f"http://127.0.0.1:{server.ports['http']}/v1"


@pytest.fixture(scope="module")
def client(base):
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0) as client:
        yield client


# --- models ---


def test_models_lists_the_models_that_take_openai_requests(client):
    # "shout" is an ensemble that takes text_input and sampling_parameters: vLLM-style.
    assert sorted(m.id for m in client.models.list()) == ["prompt_echo", "shout",
                                                          "text_stream", "trt_style"]
    model = client.models.retrieve("text_stream")
    assert model.id == "text_stream" and model.object == "model"


def test_retrieving_an_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as error:
        client.models.retrieve("nope")
    assert error.value.body["code"] == "model_not_found"


# --- chat completions ---


def test_chat_completion(client):
    reply = client.chat.completions.create(model="text_stream", messages=CHAT,
                                           extra_body=QUICK)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == "text_stream"
    assert choice.message.role == "assistant"
    assert choice.message.content == "the model has made it."
    assert choice.finish_reason == "stop"
    # text_stream reports its counts: the prompt's words, the reply's words.
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (7, 6)
    assert reply.usage.total_tokens == 13


def test_chat_completion_streams_chunk_by_chunk(client):
    chunks = list(client.chat.completions.create(
        model="text_stream", messages=CHAT, stream=True, max_tokens=4,
        stream_options={"include_usage": True}, extra_body=QUICK))
    assert chunks[0].choices[0].delta.role == "assistant"
    words = [c.choices[0].delta.content for c in chunks[1:-2]]
    assert words == ["the", " model", " has", " made"]
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert {c.id for c in chunks} == {chunks[0].id}


def test_chat_completion_streams_end_with_done(base):
    body = {"model": "text_stream", "messages": CHAT, "stream": True, **QUICK}
    with httpx.stream("POST", base + "/chat/completions", json=body, timeout=30) as reply:
        assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
        lines = [line for line in reply.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: {") for line in lines[:-1])


def test_n_choices_stream_interleaved_with_their_own_index(client):
    chunks = list(client.chat.completions.create(
        model="text_stream", messages=CHAT, stream=True, n=2, seed=1, temperature=1.0,
        max_tokens=20, extra_body={"ignore_eos": True, **QUICK}))
    texts, ends = {0: "", 1: ""}, {}
    for chunk in chunks:
        choice = chunk.choices[0]
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            ends[choice.index] = choice.finish_reason
    assert ends == {0: "length", 1: "length"}
    whole = client.chat.completions.create(
        model="text_stream", messages=CHAT, n=2, seed=1, temperature=1.0, max_tokens=20,
        extra_body={"ignore_eos": True, **QUICK})
    assert [c.message.content for c in whole.choices] == [texts[0], texts[1]]
    assert texts[0] != texts[1]  # each choice has a seed of its own


def test_seed_makes_a_sampled_reply_reproducible(client):
    def ask(seed):
        return client.chat.completions.create(
            model="text_stream", messages=CHAT, temperature=1.0, seed=seed, max_tokens=12,
            extra_body={"ignore_eos": True, **QUICK}).choices[0].message.content

    assert ask(7) == ask(7)
    assert len({ask(seed) for seed in range(4)}) > 1


def test_stop_ends_the_reply_before_the_stop_string(client):
    reply = client.chat.completions.create(model="text_stream", messages=CHAT, stop=["made"],
                                           extra_body=QUICK)
    assert reply.choices[0].message.content == "the model has "
    assert reply.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model="text_stream", messages=CHAT,
                                              stop="made", stream=True, extra_body=QUICK)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == "the model has "


def test_a_chat_template_from_the_tokenizer_config(client):
    reply = client.chat.completions.create(
        model="prompt_echo", temperature=0.5, max_tokens=3,
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    seen = json.loads(reply.choices[0].message.content)
    assert seen["prompt"] == "<s>[system] be brief</s>[user] hi</s>[assistant]"
    assert seen["sampling"] == {"temperature": 0.5, "max_tokens": 3}


def test_the_plain_template_without_a_tokenizer_config(client):
    reply = client.chat.completions.create(
        model="trt_style", messages=[{"role": "system", "content": "be brief"},
                                     {"role": "user", "content": "hi"}])
    seen = json.loads(reply.choices[0].message.content)
    assert seen["text_input"] == [[1, 1], ["system: be brief\nuser: hi\nassistant:"]]


def test_a_tensorrt_llm_style_model_gets_its_inputs(client):
    reply = client.completions.create(model="trt_style", prompt="hello", max_tokens=9,
                                      temperature=0.25, seed=3, stop=["x", "y"])
    seen = json.loads(reply.choices[0].text)
    assert seen == {"text_input": [[1, 1], ["hello"]], "max_tokens": [[1, 1], [9]],
                    "stream": [[1, 1], [False]], "stop_words": [[1, 2], ["x", "y"]],
                    "temperature": [[1, 1], [0.25]], "seed": [[1, 1], [3]]}


# --- completions ---


def test_completion(client):
    reply = client.completions.create(model="text_stream", prompt="the client", max_tokens=3,
                                      extra_body=QUICK)
    assert reply.object == "text_completion"
    assert reply.choices[0].text == "reads the model"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == 2 and reply.usage.completion_tokens == 3


def test_completion_echo_puts_the_prompt_first(client):
    reply = client.completions.create(model="text_stream", prompt="the client", max_tokens=2,
                                      echo=True, extra_body=QUICK)
    assert reply.choices[0].text == "the clientreads the"


def test_completion_streams(client):
    chunks = list(client.completions.create(model="text_stream", prompt="the client",
                                            max_tokens=3, stream=True, extra_body=QUICK))
    assert [c.choices[0].text for c in chunks] == ["reads", " the", " model", ""]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_several_prompts_give_choices_in_order(client):
    reply = client.completions.create(model="text_stream", prompt=["the client", "hello"],
                                      max_tokens=2, extra_body=QUICK)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[0].text == "reads the"


def test_empty_prompts_are_taken_as_openai_takes_them(client):
    # genai-perf's synthetic prompts include empty strings.
    reply = client.completions.create(model="text_stream", prompt=["", "hello"],
                                      max_tokens=2, extra_body=QUICK)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.usage.completion_tokens == 4


# --- refusals ---


@pytest.mark.parametrize("kwargs,message", [
    ({"messages": []}, "'messages' must be a non-empty list"),
    ({"messages": [{"role": "robot", "content": "x"}]},
     "messages[0] must be an object with a 'role' among system, developer, user, assistant, "
     "tool"),
    ({"messages": CHAT, "temperature": 3}, "'temperature' must be a number from 0 to 2"),
    ({"messages": CHAT, "max_tokens": 0}, "'max_tokens' must be an integer from 1 to "
                                          "2147483647"),
    ({"messages": CHAT, "n": 17}, "'n' must be an integer from 1 to 16"),
    ({"messages": CHAT, "stop": ["a", "b", "c", "d", "e"]},
     "'stop' must be a string or a list of up to 4 non-empty strings"),
    ({"messages": CHAT, "logprobs": True}, "'logprobs' is not supported"),
    ({"messages": CHAT, "stream_options": {"include_usage": True}},
     "`stream_options` can only be used when `stream` is True"),
])
def test_bad_chat_requests_are_400_error_objects(client, kwargs, message):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="text_stream", **kwargs)
    assert error.value.status_code == 400
    assert error.value.body == {"message": message, "type": "invalid_request_error",
                                "param": None, "code": None}


def test_an_unknown_model_is_a_404_error_object(client):
    with pytest.raises(openai.NotFoundError) as error:
        client.chat.completions.create(model="nope", messages=CHAT)
    assert error.value.body == {"message": "The model 'nope' does not exist",
                                "type": "invalid_request_error", "param": None,
                                "code": "model_not_found"}


def test_a_model_without_the_contract_is_refused(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model="echo", prompt="x")
    assert error.value.body["message"].startswith("model 'echo' does not take OpenAI requests")


def test_a_field_the_model_has_no_input_for_is_refused(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model="trt_style", prompt="x", top_p=0.5)
    assert error.value.body["message"] == "model 'trt_style' takes no 'top_p' (it has no " \
                                          "input 'top_p')"


def test_a_body_that_is_not_json(base):
    reply = httpx.post(base + "/completions", content=b"{nope", timeout=30)
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"


# --- cancellation and the HTTP front end ---


def test_a_disconnect_mid_stream_cancels_the_request(client, server):
    metrics = f"http://127.0.0.1:{server.ports['metrics']}/metrics"
    before = _cancelled(metrics)
    stream = client.chat.completions.create(
        model="text_stream", messages=CHAT, stream=True, max_tokens=100000,
        extra_body={"ignore_eos": True, "token_interval_ms": 5})
    for seen, _ in enumerate(stream):
        if seen == 3:
            break
    stream.close()
    assert wait_for(lambda: _cancelled(metrics) > before)
    assert wait_for(lambda: server.server.service.requests_in_flight == 0)
    assert server.server.manager.get("text_stream").scheduler.inflight() == 0


def _cancelled(metrics: str) -> float:
    for line in httpx.get(metrics).text.splitlines():
        if line.startswith("text_stream_cancelled_requests{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_completions_are_counted_in_statistics(client, base):
    def count():
        stats = httpx.get(base.replace("/v1", "/v2/models/text_stream/stats")).json()
        return stats["model_stats"][0]["inference_stats"]["success"]["count"]

    before = count()
    client.completions.create(model="text_stream", prompt="a", n=2, extra_body=QUICK)
    assert count() == before + 2


def test_restricted_apis_apply_to_v1(tmp_path):
    repository = write_repository(tmp_path, names=[])
    restricted = parse_restrictions(["inference:infer-key=secret",
                                     "model-repository:admin-key=admin"])
    with ServerThread(server_settings(repository, http_restricted=restricted)) as running:
        base = f"http://127.0.0.1:{running.ports['http']}/v1"
        with openai.OpenAI(base_url=base, api_key="unused", max_retries=0) as client:
            with pytest.raises(openai.PermissionDeniedError) as error:
                client.chat.completions.create(model="text_stream", messages=CHAT)
            assert error.value.body["message"] == \
                "This API is restricted, expecting header 'infer-key'"
            with pytest.raises(openai.PermissionDeniedError):
                client.models.list()
        with openai.OpenAI(base_url=base, api_key="unused", max_retries=0,
                           default_headers={"infer-key": "secret",
                                            "admin-key": "admin"}) as client:
            assert [m.id for m in client.models.list()] == ["text_stream"]
            reply = client.chat.completions.create(model="text_stream", messages=CHAT,
                                                   extra_body=QUICK)
            assert reply.choices[0].message.content


def test_allow_openai_false_leaves_v1_unrouted(tmp_path):
    repository = write_repository(tmp_path, names=[])
    with ServerThread(server_settings(repository, allow_openai=False)) as running:
        reply = httpx.get(f"http://127.0.0.1:{running.ports['http']}/v1/models")
        assert reply.status_code == 404


def test_v1_and_event_streams_over_https(tmp_path):
    """With --http-use-ssl the /v1 routes and generate_stream are on the HTTPS port like
    the rest of HTTP."""
    from mini_triton.frontends.tls import TlsFiles
    from test_tls import make_pki

    pki = make_pki(tmp_path)
    trust = ssl.create_default_context(cafile=str(pki["ca"]))
    repository = write_repository(tmp_path / "models", names=[])
    http_tls = TlsFiles("HTTP", str(pki["server_cert"]), str(pki["server_key"]),
                        str(pki["ca"]), False)
    with ServerThread(server_settings(repository, http_tls=http_tls)) as running:
        base = f"https://127.0.0.1:{running.ports['http']}"
        with httpx.Client(verify=trust, timeout=30) as http:
            reply = http.post(base + "/v2/models/text_stream/generate_stream",
                              json={"text_input": "the client", "stream": True,
                                    "parameters": {"max_tokens": 2, "token_interval_ms": 0}})
            assert reply.text.count("data: ") == 2
        with openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0,
                           http_client=httpx.Client(verify=trust)) as client:
            chunks = list(client.chat.completions.create(
                model="text_stream", messages=CHAT, stream=True, max_tokens=2,
                extra_body=QUICK))
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == "the model"
