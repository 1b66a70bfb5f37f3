"""What every command of the project shares: its configs ship inside the package, its --help is its docstring,
and a user's error ends it with one line.

Each command's Hydra configs live in the `conf` package (`pkg://conf`), so the commands compose their
configuration from an installed wheel as from a clone. A command's help text is kept in one place, the
docstring of its module: `register_help` makes it the text of `--help`, above the composed configuration.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
import typing
from contextlib import contextmanager
from importlib.resources import files
from typing import Iterator

from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from decode.errors import ConfigError, SpecdraftError, StorageError
from decode.redact import redact_text
from decode.storage import storage_problem

CONFIG_PATH = "pkg://conf"
# the lines of Hydra's and OmegaConf's messages about their own workings, left out of a user's error
HYDRA_DETAILS = ("Config search path", "provider=", "reference_type=", "object_type=")
# the settings only one kind of draft reads, moved from the sections all kinds share to pair.draft.settings
MOVED_TO_KIND_SETTINGS = ("pair.draft.capture_layers", "pair.draft.mask_token", "method.ttt_steps",
                          "method.ttt_step_weight", "method.parallel_tokens", "method.parallel_keep",
                          "method.parallel_min_keep")
GROUP_OPTION_FAILED = re.compile(r"In '(?P<group>[\w-]+)/(?P<option>[\w.-]+)': (?P<reason>.*)")
KEY_NOT_IN = re.compile(r"Key '(?P<key>[^']+)' not in '[^']+'")


_HELP: dict[str, str] = {}


def register_help(name: str, doc: str) -> None:
    """`--help` of command `name`: `doc`, then the composed configuration. Its primary config's
    `hydra.help.template` is `${specdraft_help:<name>}`, resolved only when --help asks for it."""
    _HELP[name] = (doc.strip().replace("$", "$$") + "\n\n== Configuration (override any key: key=value) ==\n\n$CONFIG\n")
    if not OmegaConf.has_resolver("specdraft_help"):
        OmegaConf.register_new_resolver("specdraft_help", lambda command: _HELP[command])


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """A user's error raised in the block as one line on stderr (`error: ...`, its secrets redacted), and an exit
    with the code of its kind; so is a write its storage refused (a full disk, a read-only directory:
    decode/storage.py) where no writer said so itself. Any other exception keeps its traceback."""
    try:
        yield
    except SpecdraftError as error:
        print(f"error: {redact_text(str(error))}", file=sys.stderr)
        sys.exit(error.exit_code)
    except Exception as error:
        problem = storage_problem(error)
        if problem is None:
            raise
        print(f"error: {redact_text(problem)}", file=sys.stderr)
        sys.exit(StorageError.exit_code)


def check_command_line(config_name: str, schema: type, arguments: list[str]) -> None:
    """What Hydra refuses on its own (an unknown option of a group, a mistyped key, a wrong type) as a user's
    error, and any key the schema does not have: Hydra's advice for a mistyped key, `+key=value`, would add it
    for the dataclasses to drop silently. Hydra's own flags (--help, --cfg, -m) are left to Hydra."""
    if any(argument.startswith("-") for argument in arguments):
        return
    try:
        for override in OverridesParser.create().parse_overrides(arguments):
            check_key(schema, override.key_or_group)
        with initialize_config_module(config_module="conf", version_base=None):
            compose(config_name, overrides=arguments)
    except (HydraException, OmegaConfBaseException) as error:
        cause = error.__cause__
        text = f"{error}: {cause}" if cause is not None and str(cause) not in str(error) else str(error)
        lines = [line.strip() for line in text.splitlines()]
        message = " ".join(line for line in lines if line and not line.startswith(HYDRA_DETAILS))
        raise ConfigError(misfit_option(message, arguments, schema) or message) from None


def misfit_option(message: str, arguments: list[str], schema: type) -> str | None:
    """Hydra's `message` about a group option on the command line whose file sets keys this command does not have
    (the options of debug, budget, domain and method are made for python -m train), said as such; else None."""
    found = GROUP_OPTION_FAILED.match(message)
    given = found and next((argument for argument in arguments
                            if argument.lstrip("+~").split("=", 1) == [found["group"], found["option"]]), None)
    if not given:
        return None
    missing = KEY_NOT_IN.search(found["reason"])
    reason = f"it sets {missing['key']}, which this command does not have" if missing else found["reason"]
    has_pair = any(field.name == "pair" for field in dataclasses.fields(schema))
    tiny = "; the tiny random pair is pair=tiny" if found["group"] == "debug" and has_pair else ""
    return f"{given} does not apply to this command ({reason}): the {found['group']} options are made for " \
           f"python -m train{tiny}"


def check_key(schema: type, key: str) -> None:
    """`key` (section.name...) is one of the schema's dataclass fields or a config group; below a field that is
    no dataclass (a dict, a list) any key goes."""
    if key == "hydra" or key.startswith("hydra.") or "/" in key:  # Hydra's own, or a group by its path
        return
    if key in MOVED_TO_KIND_SETTINGS:
        name = key.rsplit(".", 1)[1]
        raise ConfigError(f"{key} is now a setting of the draft's kind: +pair.draft.settings.{name}=... "
                          f"(docs/configuration.md)")
    parts = key.split(".")
    node = schema
    for depth, part in enumerate(parts):
        hints = typing.get_type_hints(node)
        names = [field.name for field in dataclasses.fields(node)]
        if depth == 0:
            names += [group.name for group in files("conf").iterdir() if group.is_dir() and group.name[0] != "_"]
        if part not in names:
            section = ".".join(parts[:depth])
            closest = difflib.get_close_matches(part, names, n=1)
            suggestion = f"; did you mean {'.'.join([*parts[:depth], closest[0]])}?" if closest else ""
            raise ConfigError(f"unknown key {key}: {section or 'the configuration'} has no {part!r}{suggestion} "
                              f"(--help lists every key)")
        node = next((kind for kind in (hints.get(part), *typing.get_args(hints.get(part)))
                     if dataclasses.is_dataclass(kind)), None)
        if node is None:
            return
