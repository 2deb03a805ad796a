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
        parts = [f"{where}{_clip(str(self.field), 120)}: " if self.field else where]
        body = _clip(self.message, 400)
        if self.expected is not None:
            found = "" if self.found is None else f", found {_short(self.found)}"
            body = f"{body}; " if body else ""
            body += f"expected {_clip(str(self.expected), 300)}{found}"
        parts.append(body)
        return safe_text("".join(parts))

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
    text = repr(value) if not isinstance(value, (list, dict, tuple)) or len(value) <= 20 else \
        f"<{type(value).__name__} of {len(value)} items>"
    return _clip(text, 60)


def _clip(text: str, limit: int) -> str:
    """A 5 MB op name or a 20,000-name "expected one of" list would make a 5 MB error line: keep the start."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def safe_text(text: str) -> str:
    """One printable line: control and format characters (terminal escapes, a carriage return that would
    overwrite the line, bidirectional overrides) are shown escaped instead of acting on the terminal."""
    import unicodedata

    def show(char: str) -> str:
        if char in "\n\t":
            return " "
        if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs"):
            return char.encode("unicode_escape").decode("ascii")
        return char

    return "".join(show(c) for c in text)


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
