"""Errors that reach the user as one line.

Every check of user input (files, settings, draft/target pairs, checkpoints) raises
`UserError` with a message that says what is wrong and what to do. The CLI prints it as
`error: <message>` on stderr and exits with code 2; nothing else is printed.

Both classes are `ValueError`s (what llama_cpp.Llama raises for bad arguments): an app that
embeds the Python API catches every kind of bad input with `except ValueError`, whichever
check refused it (`UserError` for settings and files, `RequestError` for request fields).
"""


class UserError(ValueError):
    """Bad input from the user: one line, what is wrong and what to do.

    `param` names the Python argument at fault (n_ctx, max_tokens, ...): library messages
    speak Python, and the CLI rewrites that name into its flag (--ctx, --max-tokens)."""

    exit_code = 2

    def __init__(self, message: str = "", param: str | None = None):
        super().__init__(message)
        self.param = param


class RequestError(UserError):
    """A request the server answers with an OpenAI-shaped error (status 400 unless said)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.param, self.code, self.status, self.kind = param, code, status, kind

    def to_dict(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


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
