"""Data only: specgguf's llama.cpp patches (*.patch), installed as `specgguf.patches` so that
`specgguf build-llama --patched` finds them in a wheel install as well as in a checkout.

A regular package for the same reason as specgguf.models: an editable install finds a mapped
sub-package only through its __init__.py."""
