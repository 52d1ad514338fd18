"""The exception for a training line the trainer cannot use: it names the line and the field.

(`data.validate.DataError` is the upload validator's report item, not an exception.)
"""

from __future__ import annotations


class BadDataError(ValueError):
    """A training or validation line that cannot be used.

    `code` is a stable machine-readable reason (e.g. `invalid_json`),
    `line_number` is 1-based within the file when known, and `param` names the
    offending field (e.g. `messages[2].weight`).
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        line_number: int | None = None,
        param: str | None = None,
    ) -> None:
        self.code = code
        self.detail = message
        self.line_number = line_number
        self.param = param
        super().__init__(self._render())

    def _render(self) -> str:
        where = f"line {self.line_number}: " if self.line_number is not None else ""
        return f"{where}{self.detail}"

    def at_line(self, line_number: int) -> BadDataError:
        """The same error, located at `line_number` of its file."""
        return BadDataError(self.code, self.detail, line_number=line_number, param=self.param)
