"""llama.cpp's n-gram lookup drafts, as llama-server runs them (b11434, common/ngram-map.cpp).

`--spec-type ngram-simple` and `--spec-type ngram-map-k` draft from the slot's own history: the tokens that followed
an earlier occurrence of its last n tokens (the last one the token just sampled, not yet in the history). In a list
with a draft model (`--spec-type ngram-map-k,draft-simple`) a lookup that returns tokens wins the round and the draft
model drafts only where every lookup returned none (decode/llama_cpp_mixed.py replays that, decode/llama_cpp_rule.py
runs it). Each lookup's draft is verified by sample-and-match: a drafted token is accepted when the target's own
sample equals it.

The ports keep llama.cpp's bounds, search order and hash table exactly, since which occurrence is copied and how
long the draft is decide what a user's server accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

LCG_FACTOR = 2654435761
HASH_SLOTS = 1 << 18  # COMMON_NGRAM_HASH_MAP_SIZE


def ngram_simple_draft(history: Sequence[int], sampled: int, size_n: int = 12, size_m: int = 48) -> list[int]:
    """`ngram-simple` (--spec-ngram-simple-size-n / -size-m): the tokens after the latest earlier occurrence of the
    last size_n tokens (history's last size_n - 1 and `sampled`), at most size_m of them and at least size_n;
    none while the history holds size_n + size_m + 1 tokens or fewer. Position 0 never matches."""
    length = len(history)
    if length <= size_n + size_m + 1:
        return []
    pattern = list(history[length - size_n + 1:]) + [sampled]
    for start in range(length - size_n - 1, 0, -1):
        if list(history[start:start + size_n]) == pattern:
            copy = min(size_m, length - (start + size_n))
            return list(history[start + size_n:start + size_n + copy]) if copy >= size_n else []
    return []


@dataclass
class NgramSimple:
    """`ngram-simple` as one slot runs it: stateless, the whole history scanned afresh each round."""

    size_n: int = 12
    size_m: int = 48

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def draft(self, history: Sequence[int], sampled: int) -> list[int]:
        return ngram_simple_draft(history, sampled, self.size_n, self.size_m)

    def accepted(self, count: int) -> None:
        pass


def ngram_hash(tokens: Sequence[int], start: int, size: int) -> int:
    value = 0
    for token in tokens[start:start + size]:
        value = (value * LCG_FACTOR + token) & 0xFFFFFFFF
    return value


@dataclass
class _Key:
    key_idx: int  # where the key n-gram was first found
    n_accepted: int  # the draft's length cap: what the last draft from this key had accepted (size_m at first)


@dataclass
class NgramMapK:
    """`ngram-map-k` (--spec-ngram-map-k-size-n / -size-m), one slot's state: a hash table from key n-grams to the
    first position stored for them, and per key the accepted length of its last draft, which caps the next one.
    Call begin() with the prompt when a request starts, draft() each round, accepted() after a draft of its own."""

    size_n: int = 12
    size_m: int = 48
    keys: list[_Key] = field(default_factory=list)
    key_map: dict[int, int] = field(default_factory=dict)  # hash slot -> position (llama.cpp: 2^18 slots, 0: empty)
    key_map_last_idx: int = 0
    size_last_begin: int = 0
    idx_last_check: int = 0
    last_key: _Key | None = None

    def begin(self, prompt: Sequence[int]) -> None:
        """A request starts with this prompt; entries past a shorter history than the last are dropped."""
        size_begin = len(prompt)
        cleanup_from = self.size_last_begin
        if cleanup_from > size_begin:
            cleanup_from = max(size_begin - self.size_n - self.size_m, 0)
        if size_begin < self.idx_last_check:
            self.key_map = {slot: idx for slot, idx in self.key_map.items() if idx < cleanup_from}
            self.key_map_last_idx = max(cleanup_from - 1, 0)
            self.keys = [key for key in self.keys if key.key_idx < cleanup_from]
        self.idx_last_check = size_begin
        self.size_last_begin = size_begin

    def draft(self, history: Sequence[int], sampled: int) -> list[int]:
        self.last_key = None
        length, n, m = len(history), self.size_n, self.size_m
        if length < 2 * n + m:
            return []
        self.idx_last_check = length
        key_tokens = list(history[length - n + 1:]) + [sampled]
        match = 0
        stored = self.key_map.get(ngram_hash(key_tokens, 0, n) % HASH_SLOTS, 0)
        if stored != 0 and stored < length - n - m - 1 and list(history[stored:stored + n]) == key_tokens:
            match = stored
        # positions not yet hashed, in llama.cpp's order: the prompt's, then those generated since
        prompt_span = range(self.size_last_begin - n - m - 1, self.key_map_last_idx, -1) \
            if self.size_last_begin > n + m + 1 else range(0)
        answer_span = range(length - n - m - 1, max(self.size_last_begin, self.key_map_last_idx), -1)
        for span in (prompt_span, answer_span):
            if match == 0:
                match = next((j for j in span if list(history[j:j + n]) == key_tokens), 0)
        for span in (prompt_span, answer_span):
            for j in span:  # the first position stored for a hash slot is kept
                self.key_map.setdefault(ngram_hash(history, j, n) % HASH_SLOTS, j)
        self.key_map_last_idx = max(length - n - m - 1, self.key_map_last_idx)
        if match == 0:
            return []
        key = next((k for k in self.keys if list(history[k.key_idx:k.key_idx + n]) == key_tokens), None)
        if key is None:
            key = _Key(key_idx=match, n_accepted=m)
            self.keys.append(key)
        self.last_key = key
        return list(history[match + n:match + n + min(m, key.n_accepted)])

    def accepted(self, count: int) -> None:
        """The last draft (this lookup's own) had `count` tokens accepted: the cap of the next draft from its key."""
        if self.last_key is not None:
            self.last_key.n_accepted = count


class Lookup(Protocol):
    """One slot's lookup as llama-server calls it: begin() when a request starts, draft() each round, accepted()
    after a draft of its own."""

    def begin(self, prompt: Sequence[int]) -> None: ...

    def draft(self, history: Sequence[int], sampled: int) -> list[int]: ...

    def accepted(self, count: int) -> None: ...


LOOKUPS = {"ngram-simple": NgramSimple, "ngram-map-k": NgramMapK}  # by their --spec-type names


@dataclass(frozen=True)
class LookupSetting:
    """A lookup type and its sizes, as llama-server's flags name them: --spec-type <spec_type>,... and
    --spec-<spec_type>-size-n / -size-m. The draft model's --spec-draft-n-max does not cap a lookup's draft: size_m
    and the server's room for tokens do."""

    spec_type: str
    size_n: int
    size_m: int

    def __post_init__(self):
        if self.spec_type not in LOOKUPS:
            raise ValueError(f"no port of llama.cpp's {self.spec_type!r} lookup; the ported ones: {sorted(LOOKUPS)}")

    def new(self) -> Lookup:
        """A fresh slot's lookup."""
        return LOOKUPS[self.spec_type](self.size_n, self.size_m)

    @classmethod
    def parse(cls, text: str) -> "LookupSetting":
        """'<spec_type>:<size_n>:<size_m>', e.g. 'ngram-map-k:12:48'."""
        spec_type, *sizes = text.split(":")
        if len(sizes) != 2 or not all(size.isdigit() and int(size) > 0 for size in sizes):
            raise ValueError(f"a llama.cpp lookup is <spec_type>:<size_n>:<size_m> with sizes >= 1, e.g. "
                             f"ngram-map-k:12:48; got {text!r}")
        return cls(spec_type, int(sizes[0]), int(sizes[1]))


LLAMA_CPP_DEFAULT = LookupSetting("ngram-map-k", 12, 48)  # llama.cpp's own sizes (common/common.h)


def spec_type_arguments(draft_spec_type: str, lookup: LookupSetting | None = None) -> list[str]:
    """llama-server's arguments to draft with the draft model (of `draft_spec_type`), and with `lookup` first at
    its sizes where given."""
    if lookup is None:
        return ["--spec-type", draft_spec_type]
    return ["--spec-type", f"{lookup.spec_type},{draft_spec_type}", f"--spec-{lookup.spec_type}-size-n",
            str(lookup.size_n), f"--spec-{lookup.spec_type}-size-m", str(lookup.size_m)]
