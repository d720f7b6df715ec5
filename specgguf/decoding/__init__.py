"""The decoding core: the speculative loop and everything that decides inside it.

`engine` (prefill, draft, verify, accept, roll back), `verify` (acceptance rules, pure numpy),
`sampling` and `noise` (the target's distribution, keyed randomness), `grammar` (a GBNF grammar
at every verified position), `tuning`, `calibration` and `profiling` (draft lengths from measured
costs and acceptance), `stats` and `textstream` (what a generation reports and prints).
It imports `runtime` and `errors` only. docs/layers.md.
"""
