"""What every command of the project shares: its configs ship inside the package, its --help is its docstring.

Each command's Hydra configs live in the `conf` package (`pkg://conf`), so the commands compose their
configuration from an installed wheel as from a clone. A command's help text is kept in one place, the
docstring of its module: `register_help` makes it the text of `--help`, above the composed configuration.
"""

from __future__ import annotations

import sys

from hydra.core.config_store import ConfigStore

from decode.errors import SpecdraftError

CONFIG_PATH = "pkg://conf"


def register_help(name: str, doc: str) -> None:
    """`--help` of the command whose primary config selects `override hydra/help: <name>`: `doc`, then its config."""
    template = (doc.strip() + "\n\n== Configuration (override any key: key=value) ==\n\n$CONFIG\n").replace("$", "$$")
    template = template.replace("$$CONFIG", "$CONFIG")
    ConfigStore.instance().store(group="hydra/help", name=name,
                                 node={"app_name": name, "header": "", "footer": "", "template": template})


def fail(error: SpecdraftError) -> None:
    """A user's error as one line, with the exit code of its kind."""
    print(f"error: {error}", file=sys.stderr)
    sys.exit(error.exit_code)
