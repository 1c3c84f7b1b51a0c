#!/usr/bin/env python3
"""serve-openai.py - moe-serve through the `openai` Python client (not part of CI).

Start a server first, e.g.
    build/moe-serve -m datasets/models/tiny-moe-mixtral --chat-template tests/fixtures/serve/chatml.jinja
then run
    pip install openai
    python3 tests/bench/serve-openai.py [--base-url http://127.0.0.1:8080/v1] [--api-key KEY]

It lists the models, asks for a completion and a chat answer (whole and
streamed, the streamed completion with its usage chunk), checks that each
streamed answer equals the whole one (greedy), that a request naming another
model raises the client's BadRequestError (400, param "model"), and prints
what it got. Exit status 1 if a check fails.
"""
import argparse
import sys

import openai
from openai import OpenAI


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default="sk-none")
    a = ap.parse_args()
    client = OpenAI(base_url=a.base_url, api_key=a.api_key)
    model = client.models.list().data[0].id
    print("model:", model)
    r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0)
    print("completion:", repr(r.choices[0].text), r.choices[0].finish_reason, r.usage)
    streamed, usage = "", None
    for chunk in client.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0,
                                           stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            streamed += chunk.choices[0].text
        if chunk.usage:
            usage = chunk.usage
    print("completion streamed:", repr(streamed), "usage:", usage.completion_tokens if usage else None, "tokens")
    if streamed != r.choices[0].text or not usage or usage.completion_tokens != r.usage.completion_tokens:
        print("the streamed completion differs from the whole one", file=sys.stderr)
        return 1
    msgs = [{"role": "user", "content": "Tell me a story"}]
    whole = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0)
    text = whole.choices[0].message.content
    print("chat:", repr(text), whole.choices[0].finish_reason)
    streamed = ""
    for chunk in client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0,
                                                stream=True):
        if chunk.choices:
            streamed += chunk.choices[0].delta.content or ""
    print("chat streamed:", repr(streamed))
    if streamed != text:
        print("the streamed chat differs from the whole answer", file=sys.stderr)
        return 1
    try:
        client.completions.create(model="no-such-model", prompt="Hi", max_tokens=4)
        print("a request for another model was accepted", file=sys.stderr)
        return 1
    except openai.BadRequestError as e:
        print("another model:", e.status_code, e.body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
