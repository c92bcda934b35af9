"""Calls a running `kvgate engine` (or a gateway in front of one) with the official OpenAI
Python SDK, streaming and not.

usage: python scripts/openai_sdk_check.py BASE_URL MODEL [CA_FILE]
CA_FILE: the PEM CA to trust for an https:// BASE_URL.
Exits non-zero (with an assertion message) on any mismatch.
"""
import ssl
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
http_client = None
if len(sys.argv) > 3:
    http_client = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=sys.argv[3]))
client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0,
                       http_client=http_client)

models = [m.id for m in client.models.list()]
assert models == [model], models

# Non-streamed chat, twice: the second reuses the prompt's cached blocks.
messages = [{"role": "system", "content": "You are terse. " * 40},
            {"role": "user", "content": "Say something about caches."}]
first = client.chat.completions.create(model=model, messages=messages, max_tokens=6,
                                       temperature=0.7, top_p=0.9, user="sdk-check",
                                       extra_body={"ignore_eos": True})
assert first.choices[0].message.role == "assistant"
assert first.choices[0].finish_reason == "length", first
assert first.usage.completion_tokens == 6, first.usage
second = client.chat.completions.create(model=model, messages=messages, max_tokens=6,
                                        extra_body={"ignore_eos": True})
assert second.usage.prompt_tokens_details.cached_tokens > 0, second.usage
assert second.choices[0].message.content == first.choices[0].message.content

# Streamed chat with the usage chunk.
chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=5, stream=True,
                                             stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True}))
assert chunks[0].choices[0].delta.role == "assistant"
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert len(text.split()) == 5, text
assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5, chunks[-1]
assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

# Completions, streamed and not.
done = client.completions.create(model=model, prompt="Once upon a time", max_tokens=4,
                                 extra_body={"ignore_eos": True})
assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 4
pieces = [c.choices[0].text for c in client.completions.create(model=model, prompt="Once upon a time",
                                                                 max_tokens=4, stream=True,
                                                                 extra_body={"ignore_eos": True}) if c.choices]
assert "".join(pieces) == done.choices[0].text, (pieces, done.choices[0].text)

# Errors arrive as the SDK's typed exceptions.
try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    raise AssertionError("expected NotFoundError")
except openai.NotFoundError as e:
    assert e.status_code == 404
try:
    client.chat.completions.create(model=model, messages=messages, n=2)
    raise AssertionError("expected BadRequestError")
except openai.BadRequestError as e:
    assert e.status_code == 400

print("openai SDK check passed against", base_url)
