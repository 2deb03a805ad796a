"""One exception hierarchy for the library; the CLI turns any of these into one line and exit code 2."""

from __future__ import annotations


class DlperfError(Exception):
    """Base of every error dlperf raises on purpose.

    The message is built from where the problem is (file, line, field) and what was expected and found,
    so that a person can fix the input without reading a traceback.
    """

    def __init__(
        self,
        message: str = "",
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
        expected: str | None = None,
        found: object = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.field = field
        self.expected = expected
        self.found = found
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        elif self.line:
            where = f"line {self.line}: "
        parts = [f"{where}{self.field}: " if self.field else where]
        body = self.message
        if self.expected is not None:
            found = "" if self.found is None else f", found {_short(self.found)}"
            body = f"{body}; " if body else ""
            body += f"expected {self.expected}{found}"
        parts.append(body)
        return "".join(parts).replace("\n", " ")

    def located(self, file: str | None = None, line: int | None = None, field: str | None = None) -> DlperfError:
        """Fill in location details that an inner function did not know."""
        if self.file is None and file is not None:
            self.file = file
        if self.line is None and line is not None:
            self.line = line
        if self.field is None and field is not None:
            self.field = field
        self.args = (str(self),)
        return self


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class SpecError(DlperfError):
    """A model or hardware file (or an override) is malformed."""


class UnitError(SpecError):
    """A quantity string has a unit we cannot read, or the wrong kind of unit."""


class ShapeError(SpecError):
    """Shapes do not flow: a kernel larger than its input, a width mismatch, ..."""


class PlanError(DlperfError):
    """A parallel plan breaks a rule (degrees, divisibility, limits)."""


class CalibrationError(DlperfError):
    """Calibration cannot run (missing device or backend) or its fit failed."""


class ValidationDataError(SpecError):
    """A measurements file for `dlperf validate` is malformed."""
