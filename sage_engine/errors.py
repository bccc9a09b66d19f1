"""User-facing errors. Their message is one line that the CLI and the app show as is."""


class SageError(Exception):
    """Base of every error a user can cause and fix (bad file, bad model pair, too long a prompt)."""


class InputError(SageError):
    """The image, video or prompt cannot be used."""


class ModelError(SageError):
    """The model pair cannot be loaded or used together."""
