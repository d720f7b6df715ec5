"""Errors that reach the user as one line.

Every check of user input (files, settings, draft/target pairs, checkpoints) raises
`UserError` with a message that says what is wrong and what to do. The CLI prints it as
`error: <message>` on stderr and exits with code 2; nothing else is printed.
"""


class UserError(Exception):
    """Bad input from the user: one line, what is wrong and what to do."""

    exit_code = 2


class LlamaError(RuntimeError):
    """llama.cpp refused or failed an operation (a return code turned into an exception)."""
