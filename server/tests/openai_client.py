"""Talks to a running `specdec serve` with the official openai client; prints one JSON line.

Usage: python openai_client.py BASE_URL MODEL
"""
import json
import sys

from openai import OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
completion = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=16, temperature=0
)
chat = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is 2 + 2?"}],
    max_tokens=16,
    temperature=0,
)
streamed = "".join(
    chunk.choices[0].delta.content or ""
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        max_tokens=16,
        temperature=0,
        stream=True,
    )
    if chunk.choices
)
try:
    client.completions.create(model=model, prompt="x", max_tokens=-5)
    refused = None
except Exception as error:  # the client raises on a 4xx
    refused = getattr(error, "status_code", None)
print(
    json.dumps(
        {
            "completion": completion.choices[0].text,
            "completion_tokens": completion.usage.completion_tokens,
            "chat": chat.choices[0].message.content,
            "chat_streamed": streamed,
            "refused_status": refused,
            "models": [m.id for m in client.models.list().data],
        }
    )
)
