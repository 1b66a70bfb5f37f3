"""What counts as a secret, and copies of settings, command lines and text without them.

Everything the product writes goes through here: the run's config.yaml, the model card, Hydra's record of a job,
every log line (decode/logfiles.py), W&B's config, metadata and command line. Replaced by "***":
  - the value under a secret-looking name (api_key, hf_token, password, auth, ...), as a key of the settings at any
    depth, as key=value (a command-line override, a URL's query parameter) or as "key": value;
  - the credentials of a URL, http://user:password@host -> http://***@host;
  - a bearer token, and tokens of a well-known shape (hf_..., sk-..., ghp_..., github_pat_..., AKIA...).
Hex digests, fingerprints and git revisions stay: nothing tells them from a key by their shape alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

REDACTED = "***"
# A name holds a credential where its last word is one of these (api_key, HF_TOKEN, authToken, x-api-key) or it
# has a word of STRONG_WORDS anywhere (password_file, client_secret_id); a word elsewhere names a figure about tokens
# or keys (token_acceptance, draft_token_ids, num_key_value_heads, max_new_tokens), not a credential.
SECRET_LAST_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "passphrase", "credential",
                               "credentials", "auth", "authorization", "cookie"})
STRONG_WORDS = frozenset({"password", "passwd", "passphrase", "secret", "credentials", "authorization"})
# a vocabulary's special tokens are settings, not credentials; OmegaConf's errors name the setting at fault full_key
NOT_SECRET_NAMES = frozenset({"bos_token", "eos_token", "pad_token", "unk_token", "mask_token", "sep_token",
                              "cls_token", "pard_token", "full_key"})
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_MARKERS = ("key", "token", "secret", "password", "passwd", "passphrase", "credential", "auth", "cookie")

_TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9_])(?:hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{32,}|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|github_pat_[A-Za-z0-9_]{30,}|glpat-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})")
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,30}://)[^\s/?#'\"<>]*@")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[\w.~+/=-]+")
# a name that may be a secret's (is_secret_name decides), bounded so that a long word costs linear time
_NAME = r"[\w.-]{0,80}(?:%s)[\w.-]{0,80}" % "|".join(_MARKERS)
_VALUE = r"""(?:'[^']*'|"[^"]*"|[^\s&#;?,'"]+)"""
_ASSIGNMENT = re.compile(rf"(?i)(?<![\w.-])({_NAME}=)({_VALUE})")  # key=value, ?key=value&...
_KEY_VALUE = re.compile(rf"""(?i)(?<![\w.@/-])(["']?{_NAME}["']?[ \t]*:[ \t]*)((?:basic\s+|token\s+)?{_VALUE})""")


def is_secret_name(name) -> bool:
    """Whether a setting called `name` holds a credential (api_key, HF_TOKEN, authToken, db.password, ...)."""
    last_part = re.split(r"[.\s/]", str(name).strip())[-1]
    if last_part.lower().replace("-", "_") in NOT_SECRET_NAMES:
        return False
    words = [word.lower() for word in _WORD.findall(last_part)]
    if not words:
        return False
    figure = len(words) > 1 and words[-2] == "per"  # bytes_per_token, seconds_per_key: a rate
    return (words[-1] in SECRET_LAST_WORDS and not figure) or not STRONG_WORDS.isdisjoint(words)


def redact_text(text: str) -> str:
    """`text` with every secret this module knows by its shape or its name replaced by "***"."""
    text = _TOKEN_SHAPES.sub(REDACTED, text)
    text = _URL_CREDENTIALS.sub(rf"\1{REDACTED}@", text)
    text = _BEARER.sub(rf"\1{REDACTED}", text)
    text = _ASSIGNMENT.sub(_redacted_value, text)
    return _KEY_VALUE.sub(_redacted_value, text)


def _redacted_value(match: re.Match) -> str:
    """name=value or name: value, the value redacted (inside its quotes, if any) where the name is a secret's."""
    named, value = match[1], match[2]
    if not is_secret_name(re.sub(r"[\s=:\"']", "", named)):
        return match[0]
    quote = value[0] if value[0] in "'\"" and value[-1] == value[0] and len(value) > 1 else ""
    return f"{named}{quote}{REDACTED}{quote}"


def redact_argument(argument: str) -> str:
    """One command-line argument: a Hydra override of a secret-looking key (wandb.api_key=..., '+hub.token=a b')
    keeps its key and loses its whole value; any other argument goes through redact_text."""
    key, equals, _ = argument.partition("=")
    if equals and re.fullmatch(r"[+~]{0,2}[\w.@/-]+", key) and is_secret_name(key.split("@")[0]):
        return f"{key}={REDACTED}"
    return redact_text(argument)


def scrub_secrets(config):
    """A copy of `config` (mappings and lists at any depth) in which every value under a secret-looking key is
    "***" and every other string, keys included, has its secrets redacted (redact_text)."""
    if isinstance(config, Mapping):
        return {_scrub_key(key): REDACTED if is_secret_name(key) else scrub_secrets(item)
                for key, item in config.items()}
    if isinstance(config, (list, tuple)):
        return [scrub_secrets(item) for item in config]
    if isinstance(config, str):
        return redact_text(config)
    return config


def _scrub_key(key):
    return redact_text(key) if isinstance(key, str) else key
