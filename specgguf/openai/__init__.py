"""The OpenAI-shaped request layer: requests in, `llama_cpp.Llama`-shaped responses out.

`params` (every request field checked once, for the API and the server), `llamaargs` (the
keyword arguments of `SpecGGUF(...)`), `constraints` (grammars from `response_format` and JSON
schemas), `tools` (tool calls through the chat template), `chat` (chat templates),
`responses` and `logprobs` (the response dicts). Below the API, above `drafters`, `decoding`
and `runtime`. docs/layers.md.
"""
