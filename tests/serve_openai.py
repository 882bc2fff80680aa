"""The official openai client against a running `mlxcel serve` (argv: base_url api_key model).

Run by tests/serve.rs; prints a final line the test looks for.
"""
import sys

import openai

base_url, api_key, model = sys.argv[1:4]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)

models = client.models.list()
assert [m.id for m in models.data] == [model], models

chat = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "hello"}],
    max_tokens=6,
    temperature=0,
)
choice = chat.choices[0]
assert chat.object == "chat.completion", chat
assert choice.message.role == "assistant"
assert choice.finish_reason in ("stop", "length"), choice
assert 1 <= chat.usage.completion_tokens <= 6, chat.usage
assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens

pieces, finish, usage = [], None, None
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "hello"}],
    max_tokens=6,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        pieces.append(c.delta.content or "")
        finish = c.finish_reason or finish
assert "".join(pieces) == choice.message.content, (pieces, choice.message.content)
assert finish == choice.finish_reason
assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens, usage

lp = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "hello"}],
    max_tokens=6,
    temperature=0,
    logprobs=True,
    top_logprobs=2,
)
content = lp.choices[0].logprobs.content
assert len(content) == lp.usage.completion_tokens, (content, lp.usage)
assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content), content
assert all(t.top_logprobs[0].logprob == t.logprob for t in content), "greedy takes the most likely token"

text = client.completions.create(model=model, prompt="once upon", max_tokens=5, temperature=0)
assert text.object == "text_completion"
streamed = "".join(
    c.choices[0].text
    for c in client.completions.create(model=model, prompt="once upon", max_tokens=5, temperature=0, stream=True)
    if c.choices
)
assert streamed == text.choices[0].text, (streamed, text.choices[0].text)

sampled = client.completions.create(model=model, prompt="once upon", max_tokens=5, temperature=0.8, top_p=0.9, seed=3)
again = client.completions.create(model=model, prompt="once upon", max_tokens=5, temperature=0.8, top_p=0.9, seed=3)
assert sampled.choices[0].text == again.choices[0].text, "a seed replays"

try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    raise AssertionError("unknown model accepted")
except openai.NotFoundError as e:
    assert e.status_code == 404
try:
    client.chat.completions.create(model=model, messages=[])
    raise AssertionError("empty messages accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400
bad = openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0)
try:
    bad.models.list()
    raise AssertionError("wrong key accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401

print("openai client: all checks passed")
