"""What every command of the project shares: its configs ship inside the package, its --help is its docstring,
and a user's error ends it with one line.

Each command's Hydra configs live in the `conf` package (`pkg://conf`), so the commands compose their
configuration from an installed wheel as from a clone. A command's help text is kept in one place, the
docstring of its module: `register_help` makes it the text of `--help`, above the composed configuration.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

from omegaconf import OmegaConf

from decode.errors import SpecdraftError

CONFIG_PATH = "pkg://conf"


_HELP: dict[str, str] = {}


def register_help(name: str, doc: str) -> None:
    """`--help` of command `name`: `doc`, then the composed configuration. Its primary config's
    `hydra.help.template` is `${specdraft_help:<name>}`, resolved only when --help asks for it."""
    _HELP[name] = (doc.strip().replace("$", "$$") + "\n\n== Configuration (override any key: key=value) ==\n\n$CONFIG\n")
    if not OmegaConf.has_resolver("specdraft_help"):
        OmegaConf.register_new_resolver("specdraft_help", lambda command: _HELP[command])


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """A user's error raised in the block as one line on stderr (`error: ...`), and an exit with the code of its
    kind; any other exception keeps its traceback."""
    try:
        yield
    except SpecdraftError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
