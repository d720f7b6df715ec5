"""The request layer: requests in the shapes clients send, responses in the shapes they expect.

`params` (every request field checked once, for the API and the server), `prepare` (a
checked request, tokenized: `Request`), `constraints` (grammars from `response_format` and JSON
schemas), `tools` (tool calls through the chat template), `chat` (chat templates),
`completions` (Completions and Chat Completions response dicts, `llama_cpp.Llama`-shaped) and
`logprobs`. Below the API, above `drafters`, `decoding` and `runtime`. docs/layers.md.
"""
