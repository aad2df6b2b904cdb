#!/usr/bin/env python3
"""End-to-end tests of `dsv4 serve` with the official `openai` Python client.

Run against a running server:

    python3 tests/e2e/test_openai.py --base-url http://127.0.0.1:8000/v1 [--model dsv4-tiny] [--api-key KEY]

`cargo test -p dsv4-cli --test server_e2e` starts `dsv4 serve --port 0` and runs this script.
Covers: models, chat, streaming chat (with usage; chat logprobs plain and streamed), a tool-call
round trip (tools declared, tool_choice "required", the DSML tool call parsed into `tool_calls`,
streamed in argument pieces that the SDK's stream helper joins, the tool result sent back), JSON answers, structured outputs (vLLM's `structured_outputs`,
SGLang's `regex`/`ebnf`), a strict pydantic tool (its arguments validated), completions (plain and
streamed; legacy logprobs; n=2 choices), vLLM's token-id extensions through extra_body, the
Responses API (streamed through the SDK's event accumulator, a function call continued with
previous_response_id, stored responses read and deleted), the Files and Batch APIs (a batch
file uploaded, run and its output read), usage, and OpenAI error types.

The embedded tiny model has random weights: plain-text answers are noise, and it often emits
special tokens that the strict DSV4 parser refuses in content. The plain chat requests therefore
pass CLEAN_STOPS, stop strings that end the answer before any such token; tool calls and JSON
answers need nothing of the kind, since a grammar constrains them.
"""

import argparse
import json
import re
import time

import openai
from harness import CLEAN_STOPS, check, run_tests


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Oslo", "Paris"]},
                "unit": {"type": "string", "enum": ["C", "F"]},
            },
            "required": ["city"],
        },
    },
}


def test_models(client, model):
    models = client.models.list()
    ids = [m.id for m in models.data]
    check(ids == [model], f"models: {ids}")
    check(client.models.retrieve(model).id == model, "retrieve")


def chat_messages():
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there"}]


def test_chat(client, model):
    r = client.chat.completions.create(
        model=model, messages=chat_messages(), max_tokens=8, temperature=0, stop=CLEAN_STOPS
    )
    check(r.object == "chat.completion", r.object)
    check(r.model == model, r.model)
    choice = r.choices[0]
    check(choice.message.role == "assistant", choice.message.role)
    check(isinstance(choice.message.content, str), repr(choice.message.content))
    check(choice.finish_reason in ("stop", "length"), choice.finish_reason)
    check(not choice.message.tool_calls, choice.message.tool_calls)
    u = r.usage
    check(u.prompt_tokens > 0 and 1 <= u.completion_tokens <= 8, u)
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens, u)
    # The SDK reads the `x-request-id` header.
    check(bool(r._request_id), r._request_id)
    return r


def test_streaming_chat(client, model):
    plain = test_chat(client, model)
    stream = client.chat.completions.create(
        model=model,
        messages=chat_messages(),
        max_tokens=8,
        temperature=0,
        stop=CLEAN_STOPS,
        stream=True,
        stream_options={"include_usage": True},
    )
    content, finish, usage, ids = "", None, None, set()
    for chunk in stream:
        ids.add(chunk.id)
        check(chunk.object == "chat.completion.chunk", chunk.object)
        for c in chunk.choices:
            content += c.delta.content or ""
            finish = c.finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    check(len(ids) == 1, f"one id per stream: {ids}")
    check(content == plain.choices[0].message.content, f"{content!r} != {plain.choices[0].message.content!r}")
    check(finish == plain.choices[0].finish_reason, finish)
    check(usage is not None and usage.completion_tokens == plain.usage.completion_tokens, usage)
    check(usage.prompt_tokens == plain.usage.prompt_tokens, usage)
    check_chat_logprobs(client, model)


def test_tool_call_round_trip(client, model):
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    r = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=300,
    )
    choice = r.choices[0]
    check(choice.finish_reason == "tool_calls", choice.finish_reason)
    calls = choice.message.tool_calls
    check(calls is not None and len(calls) == 1, calls)
    call = calls[0]
    check(call.type == "function" and call.function.name == "get_weather", call)
    args = json.loads(call.function.arguments)
    check(args.get("city") in ("Oslo", "Paris"), args)
    check(set(args) <= {"city", "unit"}, args)

    # Streamed, the same call arrives as the model writes it: its id and name, then its
    # arguments in pieces, which the SDK's stream helper joins into the same call.
    streamed = dict(
        model=model,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=300,
    )
    deltas, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **streamed):
        for c in chunk.choices:
            deltas.extend(c.delta.tool_calls or [])
            finish = c.finish_reason or finish
    check(finish == "tool_calls", finish)
    check(deltas[0].id and deltas[0].function.name == "get_weather", deltas[0])
    check(len(deltas) > 2 and all(d.id is None and d.index == 0 for d in deltas[1:]), deltas)
    joined = "".join(d.function.arguments or "" for d in deltas)
    check(joined == call.function.arguments, (joined, call.function.arguments))
    with client.chat.completions.stream(**streamed) as s:
        done = [e for e in s if e.type == "tool_calls.function.arguments.done"]
        final = s.get_final_completion().choices[0].message.tool_calls
    check(len(done) == 1 and done[0].arguments == call.function.arguments, done)
    check(final[0].function.arguments == call.function.arguments, final)

    # The tool's result goes back and the model answers.
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 4})})
    r2 = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[WEATHER_TOOL],
        temperature=0,
        max_tokens=8,
        stop=CLEAN_STOPS,
    )
    check(r2.choices[0].message.role == "assistant", r2)
    check(r2.usage.prompt_tokens > r.usage.prompt_tokens, (r2.usage, r.usage))


def test_json_answer(client, model):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Answer in JSON"}],
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
        temperature=0,
        max_tokens=200,
    )
    value = json.loads(r.choices[0].message.content)
    check(isinstance(value["ok"], bool) and 0 <= value["n"] <= 9, value)


def test_structured_outputs(client, model):
    """vLLM's structured_outputs and SGLang's regex/ebnf through extra_body, as their clients send
    them: a choice and a GBNF grammar on chat, a regex on text completions, a structural tag in
    response_format."""
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Is it raining?"}],
        temperature=0,
        max_tokens=16,
        extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}},
    )
    check(r.choices[0].message.content in ("yes", "no", "maybe"), r)
    gbnf = 'root ::= "(" [0-9] ("," [0-9]){0,2} ")"'
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "A tuple"}],
        temperature=0,
        max_tokens=16,
        extra_body={"ebnf": gbnf},
    )
    check(re.fullmatch(r"\([0-9](,[0-9]){0,2}\)", r.choices[0].message.content), r)
    r = client.completions.create(
        model=model, prompt="Code: ", max_tokens=16, temperature=0, extra_body={"regex": "[A-Z]{3}-[0-9]{3}"}
    )
    check(re.fullmatch(r"[A-Z]{3}-[0-9]{3}", r.choices[0].text), r)
    # A structural tag in response_format, as vLLM's structured-outputs docs send it.
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Numbers"}],
        temperature=0,
        max_tokens=64,
        stop=[],
        response_format={
            "type": "structural_tag",
            "format": {
                "type": "tags_with_separator",
                "separator": ",",
                "at_least_one": True,
                "tags": [{"begin": "<n>", "end": "</n>", "content": {"type": "regex", "pattern": "[0-9]{1,2}"}}],
            },
        },
    )
    check(re.fullmatch(r"<n>[0-9]{1,2}</n>(,<n>[0-9]{1,2}</n>)*", r.choices[0].message.content), r)
    try:
        client.chat.completions.create(
            model=model,
            messages=chat_messages(),
            max_tokens=4,
            extra_body={"structured_outputs": {"grammar": "root ::= undefined_rule"}},
        )
        check(False, "an undefined rule is refused")
    except openai.BadRequestError as e:
        check(e.body["param"] == "structured_outputs.grammar", e.body)


def test_strict_pydantic_tool(client, model):
    """The SDK's pydantic_function_tool marks tools strict; with tool_choice auto the answer is
    content or calls whose arguments validate as the model (never a parser error, even from the
    random tiny model)."""
    import pydantic

    class GetWeather(pydantic.BaseModel):
        city: str
        days: int

    tool = openai.pydantic_function_tool(GetWeather)
    check(tool["function"]["strict"] is True, tool)
    for prompt in ["Hi", "Weather in Oslo?", "Hello"]:
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            tools=[tool],
            temperature=0,
            max_tokens=64,
        )
        msg = r.choices[0].message
        for call in msg.tool_calls or []:
            GetWeather.model_validate_json(call.function.arguments)
        check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r)


def test_completions(client, model):
    r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0)
    check(r.object == "text_completion", r.object)
    text = r.choices[0].text
    check(isinstance(text, str), text)
    check(r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason)
    check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage)
    stream = client.completions.create(
        model=model,
        prompt="Once upon a time",
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    streamed, usage = "", None
    for chunk in stream:
        for c in chunk.choices:
            streamed += c.text
        usage = chunk.usage or usage
    check(streamed == text, f"{streamed!r} != {text!r}")
    check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, usage)
    # n=2: two sampled choices (seeds 7 and 8), indexes 0 and 1; the prompt is counted once,
    # the generated tokens summed over both choices.
    r2 = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=8, temperature=1, seed=7, n=2, logprobs=0
    )
    check(len(r2.choices) == 2, r2.choices)
    check([c.index for c in r2.choices] == [0, 1], r2.choices)
    check(r2.usage.prompt_tokens == r.usage.prompt_tokens, r2.usage)
    check(r2.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in r2.choices), r2)
    check_completion_logprobs(client, model)
    check_completion_echo(client, model)


def check_chat_logprobs(client, model):
    """logprobs=True, top_logprobs=2: one parsed entry per token; the stream's entries equal them."""
    kwargs = dict(
        model=model,
        messages=chat_messages(),
        max_tokens=8,
        temperature=0,
        stop=CLEAN_STOPS,
        logprobs=True,
        top_logprobs=2,
    )
    r = client.chat.completions.create(**kwargs)
    content = r.choices[0].logprobs.content
    check(len(content) == r.usage.completion_tokens, (len(content), r.usage))
    for e in content:
        check(isinstance(e.token, str) and e.logprob <= 0 and isinstance(e.bytes, list), e)
        check(len(e.top_logprobs) == 2, e)
        check(e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob, e)
        check(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob, e)
    streamed = []
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            if c.logprobs is not None and c.logprobs.content:
                streamed.extend(c.logprobs.content)
    check([e.model_dump() for e in streamed] == [e.model_dump() for e in content], streamed)


def check_completion_logprobs(client, model):
    """logprobs=2: the legacy parallel lists; the stream's tokens equal them."""
    r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n, lp)
    check(lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset), lp.text_offset)
    for tok, p, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        check(p <= 0 and top.get(tok) == p and max(top.values()) == p, (tok, p, top))
    streamed = []
    for chunk in client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=2, stream=True
    ):
        for c in chunk.choices:
            streamed.extend(c.logprobs.tokens)
    check(streamed == lp.tokens, (streamed, lp.tokens))


def check_completion_echo(client, model):
    """echo with logprobs, as lm-evaluation-harness scores a continuation: the prompt leads the
    text and the lists; the sequence's first token has null entries, every other one a number."""
    ids = [128 + b for b in b"hello world"]  # the tiny vocabulary's byte tokens, no BOS
    r = client.completions.create(
        model=model, prompt=ids, echo=True, logprobs=1, max_tokens=1, temperature=0
    )
    c = r.choices[0]
    check(c.text.startswith("hello world"), c.text)
    lp = c.logprobs
    check(len(lp.tokens) == len(ids) + r.usage.completion_tokens, (lp.tokens, r.usage))
    check(lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, lp)
    check(all(p is not None and p <= 0 for p in lp.token_logprobs[1:]), lp.token_logprobs)
    check("".join(lp.tokens[: len(ids)]) == "hello world", lp.tokens)
    # lm-eval's sum over the continuation " world" (context "hello": 5 tokens).
    total = sum(lp.token_logprobs[5 : len(ids)])
    check(total < 0, total)
    text = client.completions.create(model=model, prompt="hi", echo=True, max_tokens=2, temperature=0)
    check(text.choices[0].text.startswith("hi"), text.choices[0].text)


def test_vllm_token_ids(client, model):
    """vLLM's extensions through extra_body, as RL rollout clients send them: the prompt's and
    the answer's token ids, logprobs tokens named `token_id:N`, `stop_reason`, and a stream's
    ids and continuous usage."""
    extra = {"return_token_ids": True, "return_tokens_as_token_ids": True}
    r = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=1, extra_body=extra
    )
    c = r.choices[0]
    check(len(c.prompt_token_ids) == r.usage.prompt_tokens, (c.prompt_token_ids, r.usage))
    named = [f"token_id:{t}" for t in c.token_ids]
    check(named[: len(c.logprobs.tokens)] == c.logprobs.tokens, (c.token_ids, c.logprobs.tokens))
    check(len(c.token_ids) - r.usage.completion_tokens in (0, 1), (c.token_ids, r.usage))
    check(hasattr(c, "stop_reason"), c)
    streamed, prompt_ids, last_usage = [], None, None
    for chunk in client.completions.create(
        model=model,
        prompt="Once upon a time",
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body=extra,
    ):
        for ch in chunk.choices:
            prompt_ids = prompt_ids or getattr(ch, "prompt_token_ids", None)
            streamed.extend(ch.token_ids)
            check(chunk.usage.prompt_tokens == r.usage.prompt_tokens, chunk.usage)
        last_usage = chunk.usage
    check(streamed == c.token_ids, (streamed, c.token_ids))
    check(prompt_ids == c.prompt_token_ids, prompt_ids)
    check(last_usage.completion_tokens == r.usage.completion_tokens, last_usage)
    chat = client.chat.completions.create(
        model=model, messages=chat_messages(), max_tokens=8, temperature=0, stop=CLEAN_STOPS, extra_body=extra
    )
    check(len(chat.prompt_token_ids) == chat.usage.prompt_tokens, chat)
    check(len(chat.choices[0].token_ids) >= chat.usage.completion_tokens, chat)


RESPONSES_WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}},
        "required": ["city"],
    },
}


def test_responses(client, model):
    """OpenAI's Responses API: an answer, the same one streamed through the SDK's own event
    accumulator (which checks the order of the typed events), a required function call, its
    result sent back with previous_response_id (its input items listed), and a stored response
    read back and deleted."""
    clean = {"stop": CLEAN_STOPS}
    r = client.responses.create(model=model, input="Hi", max_output_tokens=8, temperature=0, extra_body=clean)
    check(r.object == "response" and r.status == "completed", r)
    check(r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, r.usage)
    with client.responses.stream(
        model=model, input="Hi", max_output_tokens=8, temperature=0, extra_body=clean
    ) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    check(deltas == final.output_text == r.output_text, (deltas, final.output_text, r.output_text))
    tools = {"tools": [RESPONSES_WEATHER_TOOL], "tool_choice": "required", "parallel_tool_calls": False}
    first = client.responses.create(
        model=model, input="Weather in Oslo?", max_output_tokens=400, temperature=0, **tools
    )
    call = next(o for o in first.output if o.type == "function_call")
    check(json.loads(call.arguments)["city"] in ("Oslo", "Paris"), call)
    second = client.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        max_output_tokens=400,
        temperature=0,
        **tools,
    )
    check(second.previous_response_id == first.id, second)
    check(second.usage.input_tokens > first.usage.input_tokens, (first.usage, second.usage))
    check(any(o.type == "function_call" for o in second.output), second.output)
    items = client.responses.input_items.list(second.id)
    check([i.type for i in items.data] == ["function_call_output"], items)
    check(client.responses.retrieve(first.id).output == first.output, first.id)
    client.responses.delete(first.id)
    try:
        client.responses.retrieve(first.id)
        raise AssertionError("a deleted response was read back")
    except openai.NotFoundError as e:
        check(e.status_code == 404, e)


def test_background_responses(client, model):
    """Background mode: a response created queued and polled with retrieve to the foreground
    answer; one created streaming, its events replayed by retrieve(stream=True,
    starting_after=N); cancelling a finished background response answers it unchanged."""
    args = dict(model=model, input="Hello", max_output_tokens=8, temperature=0, extra_body={"stop": CLEAN_STOPS})
    fg = client.responses.create(**args)
    bg = client.responses.create(background=True, **args)
    check(bg.status == "queued" and bg.background, bg)
    deadline = time.monotonic() + 60
    while bg.status in ("queued", "in_progress"):
        check(time.monotonic() < deadline, bg)
        time.sleep(0.05)
        bg = client.responses.retrieve(bg.id)
    check((bg.status, bg.output_text) == (fg.status, fg.output_text), (bg, fg))
    events = list(client.responses.create(background=True, stream=True, **args))
    check(events[0].type == "response.created" and events[0].response.status == "queued", events[0])
    rid = events[0].response.id
    replay = list(client.responses.retrieve(rid, stream=True, starting_after=2))
    check([e.sequence_number for e in replay] == [e.sequence_number for e in events[3:]], replay)
    check(replay[-1].response.output_text == fg.output_text, replay[-1])
    check(client.responses.cancel(rid).status == events[-1].response.status, rid)


def test_batches(client, model):
    """The Files and Batch APIs: upload a JSONL file, run it as a batch, read the output file."""
    lines = [
        {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": model, "messages": chat_messages(), "max_tokens": 4 + i,
                  "temperature": 0, "stop": CLEAN_STOPS}}
        for i in range(3)
    ]
    data = "\n".join(json.dumps(line) for line in lines).encode()
    f = client.files.create(file=("batch.jsonl", data), purpose="batch",
                            expires_after={"anchor": "created_at", "seconds": 3600})
    check(f.purpose == "batch" and f.bytes == len(data), f)
    check(f.expires_at == f.created_at + 3600, f)
    batch = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
        metadata={"suite": "e2e"}, output_expires_after={"anchor": "created_at", "seconds": 7200},
    )
    deadline = time.time() + 120
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        check(time.time() < deadline, f"batch {batch.id} still {batch.status}")
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
    check(batch.status == "completed", batch)
    check(batch.request_counts.total == 3 and batch.request_counts.completed == 3, batch.request_counts)
    out = [json.loads(l) for l in client.files.content(batch.output_file_id).text.splitlines()]
    check([o["custom_id"] for o in out] == ["req-0", "req-1", "req-2"], out)
    kept = client.files.retrieve(batch.output_file_id)
    check(kept.expires_at == kept.created_at + 7200, kept)
    alone = client.chat.completions.create(**lines[1]["body"])
    got = out[1]["response"]["body"]["choices"][0]["message"]["content"]
    check(got == alone.choices[0].message.content, (got, alone.choices[0].message.content))
    check(any(b.id == batch.id for b in client.batches.list()), "batch not listed")
    check(client.files.delete(f.id).deleted, f.id)


def test_errors(client, model):
    try:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError as e:
        check(e.status_code == 404, e)
    try:
        client.chat.completions.create(model=model, messages=[])
        raise AssertionError("empty messages accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "messages" in str(e), e)


TESTS = [
    test_models,
    test_chat,
    test_streaming_chat,
    test_tool_call_round_trip,
    test_json_answer,
    test_structured_outputs,
    test_strict_pydantic_tool,
    test_completions,
    test_vllm_token_ids,
    test_responses,
    test_background_responses,
    test_batches,
    test_errors,
]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", default="dsv4-tiny")
    p.add_argument("--api-key", default="unused")
    a = p.parse_args()
    client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0, timeout=120)
    run_tests(f"openai {openai.__version__}", TESTS, client, a.model)

if __name__ == "__main__":
    main()
