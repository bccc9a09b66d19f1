"""User-facing errors. Their message is one line that the CLI and the app show as is."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): a library's multi-line
    message, made one line."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class SageError(Exception):
    """Base of every error a user can cause and fix (bad file, bad model pair, too long a prompt)."""


class InputError(SageError):
    """The image, video or prompt cannot be used."""


class ModelError(SageError):
    """The model pair cannot be loaded or used together."""
