#!/usr/bin/env python3
"""OpenAI's own Python client (`pip install openai`) against a running `rocmforge serve`; run by
tests/serve.rs (`the_command_serves_...`), which compares with the library's generator.

    openai_client.py URL MODEL PROMPT MAX_TOKENS EXPECTED_TEXT

Exits 0 when every check holds, else prints each failed one and exits 1.
"""
import sys

import openai

url, model, prompt, n, want = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
failed = []


def check(what, got, expected):
    if got != expected:
        failed.append(f"{what}: got {got!r}, expected {expected!r}")


check("models", [m.id for m in client.models.list().data], [model])

r = client.completions.create(model=model, prompt=prompt, max_tokens=n, temperature=0)
check("completion text", r.choices[0].text, want)
check("usage total", r.usage.prompt_tokens + r.usage.completion_tokens, r.usage.total_tokens)

chunks = client.completions.create(model=model, prompt=prompt, max_tokens=n, temperature=0,
                                   stream=True)
check("streamed text", "".join(c.choices[0].text for c in chunks if c.choices), want)

# The tiny model's chat template concatenates the contents: the chat is the same prompt.
chat = client.chat.completions.create(model=model, max_tokens=n, temperature=0,
                                      messages=[{"role": "user", "content": prompt}])
check("chat role", chat.choices[0].message.role, "assistant")
check("chat text", chat.choices[0].message.content, want)

# Bad requests come back as the client's typed errors, with the server's status.
for what, kwargs, status in [("n = 2", {"n": 2}, 400), ("unknown model", {"model": "nope"}, 400),
                             ("max_tokens past the context", {"max_tokens": 10 ** 6}, 400)]:
    args = {"model": model, "prompt": prompt, "max_tokens": n, **kwargs}
    try:
        client.completions.create(**args)
        failed.append(f"{what}: accepted")
    except openai.APIStatusError as e:
        check(f"{what}: status", e.status_code, status)

for f in failed:
    print(f, file=sys.stderr)
sys.exit(1 if failed else 0)
