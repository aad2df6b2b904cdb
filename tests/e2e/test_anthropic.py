#!/usr/bin/env python3
"""End-to-end tests of `dsv4 serve`'s Messages API with the official `anthropic` Python client.

Run against a running server:

    python3 tests/e2e/test_anthropic.py --base-url http://127.0.0.1:8000 [--model dsv4-tiny] [--api-key KEY]

(the SDK adds `/v1/messages` itself). `cargo test -p dsv4-cli --test server_e2e` starts
`dsv4 serve --port 0` and runs this script. Covers: a message with a system prompt of text
blocks (and its request id), the SDK's stream helper (text deltas and the final message it
accumulates, equal to the unstreamed answer), a tool-use round trip (tool_choice any, the tool_use block's input parsed,
the tool_result sent back), a streamed tool call and thinking (the SDK accumulating
input_json_delta and thinking_delta events into blocks), omitted thinking (display
"omitted": the signature holds the reasoning and sent back restores it), a JSON answer under
output_config.format, count_tokens, the model list, a Message Batch (create, retrieve until
ended, results read through its results_url, list, delete), and the SDK's error classes.

The embedded tiny model has random weights: plain-text answers are noise, and it often emits
special tokens that the strict DSV4 parser refuses in content. Plain requests therefore pass
CLEAN_STOPS as stop_sequences; tool calls and JSON answers need nothing of the kind, since a
grammar constrains them.
"""

import argparse
import base64
import json
import time

import anthropic
from harness import CLEAN_STOPS, check, run_tests


WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Oslo", "Paris"]},
            "unit": {"type": "string", "enum": ["C", "F"]},
        },
        "required": ["city"],
    },
}

ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]

# Greedy answers, so a streamed and an unstreamed request agree. The SDK's create() no longer
# takes `temperature` (2.x), so it goes in the body as an extra field; the server reads it.
GREEDY = {"temperature": 0}


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def plain(client, model, **extra):
    return client.messages.create(
        model=model,
        max_tokens=24,
        extra_body=GREEDY,
        stop_sequences=CLEAN_STOPS,
        **extra,
    )


def test_message(client, model):
    m = plain(
        client,
        model,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "Say hello"}],
    )
    check(isinstance(m, anthropic.types.Message), type(m))
    check(m.role == "assistant" and m.type == "message", m)
    check(m.id.startswith("msg_"), m.id)
    check(m.stop_reason in ("end_turn", "max_tokens", "stop_sequence"), m.stop_reason)
    check((m.stop_sequence is not None) == (m.stop_reason == "stop_sequence"), m)
    check(all(b.type == "text" for b in m.content), m.content)
    u = m.usage
    check(u.input_tokens + (u.cache_read_input_tokens or 0) > 0, u)
    check(0 <= u.output_tokens <= 24, u)
    # The SDK reads the `request-id` header; a client's own X-Request-Id comes back.
    check(bool(m._request_id), m._request_id)
    mine = plain(
        client,
        model,
        messages=[{"role": "user", "content": "Say hello"}],
        extra_headers={"X-Request-Id": "e2e-anthropic-1"},
    )
    check(mine._request_id == "e2e-anthropic-1", mine._request_id)


def test_stream_helper(client, model):
    kwargs = dict(
        model=model,
        max_tokens=24,
        extra_body=GREEDY,
        stop_sequences=CLEAN_STOPS,
        messages=[{"role": "user", "content": "Tell me a story"}],
    )
    with client.messages.stream(**kwargs) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    check("".join(pieces) == text_of(final), (pieces, final))
    once = client.messages.create(**kwargs)
    check(text_of(once) == text_of(final), (once, final))
    check(once.stop_reason == final.stop_reason, (once, final))
    check(once.usage.output_tokens == final.usage.output_tokens, (once.usage, final.usage))


def test_tool_use_round_trip(client, model):
    m = client.messages.create(
        model=model,
        max_tokens=200,
        extra_body=GREEDY,
        messages=ASK,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    check(m.stop_reason == "tool_use", m)
    calls = [b for b in m.content if b.type == "tool_use"]
    check(len(calls) == 1, m.content)
    call = calls[0]
    check(call.name == "get_weather" and call.id.startswith("toolu_"), call)
    check(call.input.get("city") in ("Oslo", "Paris"), call.input)
    answer = plain(
        client,
        model,
        messages=ASK
        + [
            {"role": "assistant", "content": m.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "-3 C"}],
            },
        ],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "none"},
    )
    check(all(b.type == "text" for b in answer.content), answer)


def thought_and_call(client, model, thinking):
    """The final message of a streamed, thinking answer that must call get_weather once."""
    with client.messages.stream(
        model=model,
        max_tokens=3000,
        extra_body=GREEDY,
        messages=ASK,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        thinking=thinking,
    ) as stream:
        return stream.get_final_message()


def test_streamed_thinking_and_tool_use(client, model):
    final = thought_and_call(client, model, {"type": "enabled", "budget_tokens": 1024})
    kinds = [b.type for b in final.content]
    check(kinds == ["thinking", "tool_use"], kinds)
    check(isinstance(final.content[0].thinking, str), final.content[0])
    check(final.content[1].input.get("city") in ("Oslo", "Paris"), final.content[1])
    check(final.stop_reason == "tool_use", final)


def test_omitted_thinking_round_trip(client, model):
    # display "omitted": the SDK accumulates a thinking block with no text and the signature
    # that holds it; sent back as the SDK hands it over, the reasoning is read from it.
    final = thought_and_call(
        client, model, {"type": "enabled", "budget_tokens": 64, "display": "omitted"})
    thought, call = final.content
    check(thought.type == "thinking" and thought.thinking == "", thought)
    check(thought.signature.startswith("dsv4:1:"), thought)
    reasoning = base64.b64decode(thought.signature[len("dsv4:1:"):]).decode()
    result = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": "-3 C"}]}

    def count(block):
        turn = {"role": "assistant", "content": [block, call]}
        return client.messages.count_tokens(
            model=model, messages=ASK + [turn, result], tools=[WEATHER_TOOL],
            thinking={"type": "adaptive"}).input_tokens

    shown = {"type": "thinking", "thinking": reasoning, "signature": ""}
    check(count(thought) == count(shown), (count(thought), count(shown)))


def test_json_output(client, model):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "ok": {"type": "boolean"}},
        "required": ["city", "ok"],
        "additionalProperties": False,
    }
    m = client.messages.create(
        model=model,
        max_tokens=300,
        extra_body=GREEDY,
        messages=ASK,
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    value = json.loads(text_of(m))
    check(set(value) == {"city", "ok"} and isinstance(value["ok"], bool), value)


def test_count_tokens(client, model):
    bare = client.messages.count_tokens(model=model, messages=ASK)
    with_tools = client.messages.count_tokens(model=model, messages=ASK, tools=[WEATHER_TOOL])
    check(0 < bare.input_tokens < with_tools.input_tokens, (bare, with_tools))
    m = plain(client, model, messages=ASK)
    u = m.usage
    check(u.input_tokens + (u.cache_read_input_tokens or 0) == bare.input_tokens, (u, bare))


def test_models(client, model):
    listed = [m.id for m in client.models.list()]
    check(listed == [model], listed)
    one = client.models.retrieve(model)
    check(one.id == model and one.type == "model" and one.display_name == model, one)


def test_message_batches(client, model):
    params = dict(model=model, max_tokens=8, stop_sequences=CLEAN_STOPS, **GREEDY)
    batch = client.messages.batches.create(
        requests=[
            {"custom_id": "hello", "params": {**params, "messages": [{"role": "user", "content": "Say hello"}]}},
            {"custom_id": "other-model", "params": {**params, "model": "claude-not-here", "messages": ASK}},
        ]
    )
    check(batch.type == "message_batch" and batch.id.startswith("msgbatch_"), batch)
    check(batch.processing_status in ("in_progress", "ended"), batch)
    for _ in range(600):
        batch = client.messages.batches.retrieve(batch.id)
        if batch.processing_status == "ended":
            break
        time.sleep(0.1)
    check(batch.processing_status == "ended", batch)
    counts = batch.request_counts
    check((counts.succeeded, counts.errored, counts.processing) == (1, 1, 0), counts)
    check(batch.ended_at is not None and batch.ended_at >= batch.created_at, batch)
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    check(set(results) == {"hello", "other-model"}, results)
    check(results["hello"].type == "succeeded", results["hello"])
    alone = client.messages.create(
        model=model,
        max_tokens=8,
        stop_sequences=CLEAN_STOPS,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Say hello"}],
    )
    check(text_of(results["hello"].message) == text_of(alone), (results["hello"], alone))
    check(results["other-model"].type == "errored", results["other-model"])
    check(results["other-model"].error.error.type == "not_found_error", results["other-model"])
    check(batch.id in [b.id for b in client.messages.batches.list(limit=5)], "listed")
    deleted = client.messages.batches.delete(batch.id)
    check(deleted.type == "message_batch_deleted" and deleted.id == batch.id, deleted)
    try:
        client.messages.batches.retrieve(batch.id)
        raise AssertionError("a deleted batch was found")
    except anthropic.NotFoundError as e:
        check(e.body["error"]["type"] == "not_found_error", e.body)


def test_errors(client, model):
    try:
        plain(
            client,
            model,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                        }
                    ],
                }
            ],
        )
        raise AssertionError("an image block was accepted")
    except anthropic.BadRequestError as e:
        check(e.status_code == 400, e)
        check(e.body["error"]["type"] == "invalid_request_error", e.body)
        check("text only" in e.body["error"]["message"], e.body)
    try:
        plain(client, "claude-not-here", messages=ASK)
        raise AssertionError("an unknown model was accepted")
    except anthropic.NotFoundError as e:
        check(e.body["error"]["type"] == "not_found_error", e.body)


TESTS = [
    test_message,
    test_stream_helper,
    test_tool_use_round_trip,
    test_streamed_thinking_and_tool_use,
    test_omitted_thinking_round_trip,
    test_json_output,
    test_count_tokens,
    test_models,
    test_message_batches,
    test_errors,
]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default="dsv4-tiny")
    p.add_argument("--api-key", default="unused")
    a = p.parse_args()
    client = anthropic.Anthropic(base_url=a.base_url, api_key=a.api_key, max_retries=0, timeout=120)
    run_tests(f"anthropic {anthropic.__version__}", TESTS, client, a.model)

if __name__ == "__main__":
    main()
