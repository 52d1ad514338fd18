"""What loading or adapting a model refuses: the tenant's to fix, reported as user errors.

The trainer maps both to exit codes (`train/runner.py`); the serving engine and
the control plane's base-model checks meet them too, so they live below both.
"""

from __future__ import annotations


class UnsupportedJob(Exception):
    """The spec asks for a method or training type this trainer does not run."""

    code = "unsupported_method"


class UserInputError(Exception):
    """The tenant's configuration or data cannot be used as given, found where the trainer
    knows the input is the tenant's (LoRA target modules, the data files, the eval config).
    `code` is stable, `param` names the request field, the message says what to change and
    holds nothing of the host (no paths, no reprs): it is shown to the tenant as is."""

    def __init__(self, code: str, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param
