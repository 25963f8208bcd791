"""User-facing errors: one line, exit status 2, never a traceback."""

from __future__ import annotations

import errno
import re
from pathlib import Path


class UserError(ValueError):
    """A mistake in what the user gave (name, file, config); the message names the valid choices."""


def choices_error(what: str, got: str, valid: list[str] | tuple[str, ...]) -> UserError:
    shown = ", ".join(sorted(valid))
    return UserError(f"unknown {what} {got!r}; valid: {shown}")


# errno -> what the user should read instead of "[Errno 21] Is a directory: 'x'"
_OS_WORDS = {errno.ENOENT: "no such file or directory", errno.EISDIR: "is a directory, not a file",
             errno.ENOTDIR: "a part of the path is not a directory", errno.EACCES: "permission denied"}
_RAW_ERRNO = re.compile(r"\[Errno (\d+)\] ([^:\n]+)(?:: '[^'\n]*')?")


def os_error_text(e: OSError) -> str:
    """A short reason for an OSError, without Python's "[Errno N]" prefix or the repeated path."""
    if e.errno in _OS_WORDS:
        return _OS_WORDS[e.errno]
    return (e.strerror or str(e)).lower()


def plain_os_errors(msg: str) -> str:
    """Rewrite any raw "[Errno N] Text: 'path'" inside a message the way os_error_text words it."""
    def word(m: re.Match[str]) -> str:
        return _OS_WORDS.get(int(m.group(1)), m.group(2).lower())
    return _RAW_ERRNO.sub(word, msg)


def read_text(path: str | Path, what: str) -> str:
    """The text of a file the user named; a missing file, a directory or no permission is one UserError."""
    try:
        return Path(path).read_text()
    except UnicodeDecodeError:
        raise UserError(f"cannot read {what} {path}: not a text file") from None
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {os_error_text(e)}") from None
