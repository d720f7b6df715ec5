"""The runtime: llama.cpp itself and what must be known before it is called.

`native` (the only ctypes module: owned handles), `target` (the target model and its context),
`ggufinfo` (cheap GGUF metadata reads), `compat` (every check that stops llama.cpp from aborting
on a bad pair), `amx` (is this build's AMX path safe on this CPU),
`toolchain` (the compiler flags every build needs), `doctor` (the report), `patchprobe` (does the library carry the Eagle3 patches), `building` (`specgguf build-llama`),
`rpc` (RPC servers for target layers) and `defaults` (the embedded models, the user cache).
It imports nothing of specgguf but `errors` and `synthetic` (probe models). docs/layers.md.
"""
