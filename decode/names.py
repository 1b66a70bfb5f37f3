"""Names from the configuration, or from the input, that become part of a path (`outputs/<domain.name>/...`, the
answer cache, the monitor's files per domain): checked to be plain names first, so that none leads out of its
directory (`..`, `/`) or hides in it (a leading dot)."""

from __future__ import annotations

import re

from decode.errors import ConfigError

MAX_NAME = 100  # characters
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,%d}" % (MAX_NAME - 1))
NAME_RULE = f"a name of 1 to {MAX_NAME} letters, digits, _ . - that starts with a letter, a digit or _"


def is_plain_name(name) -> bool:
    """NAME_RULE: a name that is one path component, neither `.` nor `..` nor hidden."""
    return isinstance(name, str) and PLAIN_NAME.fullmatch(name) is not None


def check_name(name, setting: str) -> str:
    """`name`, the value of `setting`, when it is plain (NAME_RULE); else a ConfigError saying what to change."""
    if not is_plain_name(name):
        raise ConfigError(f"{setting}: {name!r} becomes part of a path, so it must be {NAME_RULE}; choose such a "
                          f"name")
    return name
