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


def missing_path(path, what: str) -> str:
    """Why `path` cannot be opened, for a path that does not exist as given: a symlink loop,
    a symlink to nothing, or simply no such file ("file not found" would mislead for the first two)."""
    import errno
    import os

    if os.path.islink(path):
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return f"{what} {path} is a symlink loop; point it at a real file"
            return f"{what} {path} is a broken symlink (to {os.readlink(path)}, which does not exist)"
    return f"{what} not found: {path} (check the path)"
