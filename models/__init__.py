"""Data only: the registry of released DeepSpec checkpoints (deepspec.json).

A regular package (not a namespace one) because specgguf itself is a regular package now, and
an editable install finds a mapped sub-package only through its __init__.py."""
