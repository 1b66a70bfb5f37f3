"""Domain prompts: the shipped JSONL sets, a user's JSONL/Parquet file, a Hugging Face dataset, or a mix of
other domains (source mix: the general domain).

Prompt files are checked line by line before any model work, so a malformed
line fails at start with its file, line number and reason. Once the target's tokenizer is known (still before any
generation), no prompt may hold a control token of its chat template (free_of_control_tokens). One text under
several ids never lands in two splits: a held-out (or validation) prompt that repeats a training prompt's text
leaves its split, with a warning (disjoint_texts).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import datasets
import numpy as np

from decode.errors import ConfigError, PromptError
from decode.examples import Example, top_k_arrays
from distill.config import DomainConfig, check_magpie_settings
from distill.control_tokens import check_system_prompt, without_control_tokens
from distill.conversations import Message, messages_of, read_conversations, user_turns
from distill.domains import domain_config
from distill.jsonl import json_objects
from distill.served_responses import ServedResponse, parse_served

log = logging.getLogger(__name__)

SHIPPED_DIR = Path(__file__).parent / "prompts"
# validation tunes knobs and drives the training-time metric; heldout is only ever evaluated
SPLITS = ("train", "validation", "heldout")
SOURCES = ("shipped", "jsonl", "parquet", "hf", "conversations", "magpie", "mix")
MAGPIE_COMPONENT = "magpie"  # in a mix: the component of the prompts the target writes (train only)
EXTRA_ID_PREFIX = "extra-"  # the ids of domain.extra_prompts


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str  # a conversation's first user message
    split: str
    messages: tuple[Message, ...] = ()  # a conversation source's conversation (distill/conversations.py)
    # the response serving gave it, with how it was sampled: scored by the target where generate would sample as
    # it was (distill/served_responses.py); no part of the prompt's identity
    served: ServedResponse | None = field(default=None, compare=False)
    where: str = field(default="", compare=False)  # file:line or dataset row, for messages about it


@dataclass(frozen=True)
class DomainPrompts:
    train: list[Prompt]
    validation: list[Prompt]
    heldout: list[Prompt]


def shipped_domains() -> list[str]:
    return sorted(path.stem for path in SHIPPED_DIR.glob("*.jsonl"))


def read_jsonl_prompts(path: Path, prompt_field: str = "prompt", split_field: str = "split",
                       id_field: str = "id") -> list[Prompt]:
    if not path.is_file():
        raise PromptError(f"prompt file not found: {path}")
    prompts, seen_ids = [], set()
    for where, number, record in json_objects(path, empty_lines="refuse"):
        text = record.get(prompt_field)
        if not isinstance(text, str) or not text.strip():
            raise PromptError(f"{where}: field {prompt_field!r} must be a non-empty string")
        split = record.get(split_field, "train")
        if split not in SPLITS:
            raise PromptError(f"{where}: field {split_field!r} must be one of {SPLITS}, got {split!r}")
        prompt_id = str(record.get(id_field, f"{path.stem}-{number}"))
        if prompt_id in seen_ids:
            raise PromptError(f"{where}: duplicate id {prompt_id!r}")
        seen_ids.add(prompt_id)
        try:
            served = parse_served(record)
        except ValueError as error:
            raise PromptError(f"{where}: {error}") from None
        prompts.append(Prompt(prompt_id, text, split, served=served, where=where))
    if not prompts:
        raise PromptError(f"{path}: no prompts")
    return prompts


def read_prompts_by_domain(path: Path) -> dict[str, list[str]]:
    """A JSONL file of {"domain": ..., "prompt": ...} lines (a request log qualifies) -> domain -> its prompts,
    in file order, each once."""
    if not path.is_file():
        raise PromptError(f"prompt file not found: {path}")
    by_domain: dict[str, dict[str, None]] = {}  # an ordered set per domain
    for where, _, record in json_objects(path):
        if not isinstance(record.get("domain"), str) or not record["domain"]:
            raise PromptError(f"{where}: need a JSON object with a non-empty string field 'domain'")
        text = record.get("prompt")
        if not isinstance(text, str) or not text.strip():
            raise PromptError(f"{where}: field 'prompt' must be a non-empty string")
        by_domain.setdefault(record["domain"], {})[text] = None
    if not by_domain:
        raise PromptError(f"{path}: no prompts")
    return {domain: list(prompts) for domain, prompts in by_domain.items()}


def load_prompts(domain: str, split: str | None = None) -> list[Prompt]:
    """The shipped prompts of a domain (optionally one split)."""
    path = SHIPPED_DIR / f"{domain}.jsonl"
    if not path.is_file():
        raise PromptError(f"no shipped prompts for domain {domain!r}; shipped: {shipped_domains()}")
    prompts = read_jsonl_prompts(path)
    return [p for p in prompts if split is None or p.split == split]


def examples_from_records(records, max_length: int, prompt_labels: bool = False) -> list[Example]:
    """Dataset rows (input_ids, prompt_length, target_top_ids, target_top_logprobs) -> examples cut to
    max_length tokens, labelled at the answer's tokens, and with prompt_labels at the prompt's labelled tokens
    too where a row has them (distill/generate.py label_prompts). Rows whose prompt leaves no room for an answer
    token are dropped."""
    examples, dropped = [], 0
    for record in records:
        ids = list(record["input_ids"])[:max_length]
        if len(ids) <= record["prompt_length"]:
            dropped += 1
            continue
        labels_from, top_ids, top_logprobs = record["prompt_length"], record["target_top_ids"], \
            record["target_top_logprobs"]
        if prompt_labels and len(record.get("prompt_top_ids", ())):
            labels_from = record["prompt_labels_from"]
            top_ids, top_logprobs = joined_labels(top_k_arrays(record["prompt_top_ids"], record["prompt_top_logprobs"]),
                                                  top_k_arrays(top_ids, top_logprobs))
        labelled = len(ids) - labels_from
        examples.append(Example(ids, labels_from, top_ids[:labelled], top_logprobs[:labelled],
                                prompt_length=record["prompt_length"]))
    if dropped:
        log.warning("%d of %d sequences have prompts of max_length (%d) tokens or more and are left out; "
                    "raise method.max_length to keep them", dropped, dropped + len(examples), max_length)
    return examples


def joined_labels(*spans: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, log-probabilities) of spans of labelled tokens -> those of the spans one after the other, cut to the
    narrowest span's k: a server may give an answer fewer log-probabilities than the target here labels its prompt
    with, and at_one_width cuts every label to the narrowest of all."""
    width = min(ids.shape[1] for ids, _ in spans if len(ids))
    return (np.concatenate([ids[:, :width] for ids, _ in spans]),
            np.concatenate([logprobs[:, :width] for _, logprobs in spans]))


def at_one_width(*groups: list[Example]) -> list[list[Example]]:
    """The groups of examples with every labelled token's target cut to its w most likely, w the fewest any token
    of any group has, with a warning where that cuts: a server that gives fewer log-probabilities than asked
    (distill/answers_from_server.py) records its answers narrower than the target labels here (the prompts' tokens, the
    code excerpts, the served responses it scores), and a batch, like the loss, takes one width. The k most likely
    of a distribution are its first k sorted, so a cut one is what a narrower record would have held."""
    widths = [example.target_top_ids.shape[1] for group in groups for example in group if len(example.target_top_ids)]
    if not widths or min(widths) == max(widths):
        return list(groups)
    width = min(widths)
    log.warning("the target's recorded distributions hold %d to %d most likely tokens (a server gave fewer "
                "log-probabilities than generate.top_k_logprobs asked): every one is cut to its %d most likely",
                width, max(widths), width)
    return [[replace(example, target_top_ids=example.target_top_ids[:, :width],
                     target_top_logprobs=example.target_top_logprobs[:, :width]) for example in group]
            for group in groups]


def answer_token_count(records, max_length: int) -> int:
    """The answer tokens of the examples examples_from_records makes of these rows."""
    return sum(max(min(len(ids), max_length) - prompt_length, 0)
               for ids, prompt_length in zip(records["input_ids"], records["prompt_length"]))


def load_domain_prompts(domain_cfg: DomainConfig) -> DomainPrompts:
    """The domain's train, validation and held-out prompts from its configured source, checked before any
    model work.

    source: shipped (the JSONL sets in distill/prompts, split by template), jsonl or parquet (a local
    file), hf (a Hugging Face dataset id, loaded with `datasets`), conversations (chat conversations, a local
    JSONL file or a dataset id: distill/conversations.py), mix (other domains' prompts, each split as its own
    source splits them: mixed_prompts). `fields` maps prompt/split/id to the source's column names. Without a
    heldout split, heldout_fraction of the prompts (of a conversation source: of the conversations, each whole in
    one split) is held out; without a validation split, the same fraction of the training prompts becomes
    validation (both chosen by a hash of the id, so stable across runs). Prompts of source magpie (and a mix's
    domain.magpie_prompts) are written by the target: distill/magpie.py reads them once the target is loaded.
    """
    if domain_cfg.source == "mix":  # each component split as its own source splits it
        split = mixed_prompts(domain_cfg)
    else:
        split = _source_prompts(domain_cfg)
    if domain_cfg.extra_prompts:
        extra_file = _existing_file(domain_cfg.extra_prompts)
        if extra_file.stat().st_size:
            split = with_extra_training_prompts(split, read_jsonl_prompts(extra_file))
        else:  # the monitor's traffic file when no request logged a prompt
            log.warning("%s is empty: no extra training prompts", extra_file)
    if not split.train or not split.validation or not split.heldout:
        raise PromptError(f"domain {domain_cfg.name}: need train, validation and heldout prompts, got "
                          f"{len(split.train)}, {len(split.validation)} and {len(split.heldout)}")
    return split


def _source_prompts(domain_cfg: DomainConfig) -> DomainPrompts:
    """The prompts of a source other than mix, split."""
    source = domain_cfg.source
    fields = domain_cfg.fields or {}
    prompt_field, split_field, id_field = (fields.get("prompt", "prompt"), fields.get("split", "split"),
                                           fields.get("id", "id"))
    if source == "shipped":
        prompts = load_prompts(domain_cfg.name)
    elif source == "jsonl":
        prompts = read_jsonl_prompts(_existing_file(domain_cfg.path), prompt_field, split_field, id_field)
    elif source in ("parquet", "hf"):
        prompts = _table_prompts(domain_cfg, prompt_field, split_field, id_field)
    elif source == "conversations":
        prompts = _conversation_prompts(domain_cfg)
    elif source == "magpie":
        raise PromptError(f"domain {domain_cfg.name}: source magpie prompts are written by the target, so they are "
                          f"read once it is loaded (distill.magpie.magpie_domain_prompts)")
    else:
        raise PromptError(f"domain {domain_cfg.name}: source must be one of {', '.join(SOURCES)}, got {source!r}")
    if not any(p.split == "heldout" for p in prompts):
        prompts = _hash_split(prompts, domain_cfg.heldout_fraction, "train", "heldout")
    if not any(p.split == "validation" for p in prompts):
        prompts = _hash_split(prompts, domain_cfg.heldout_fraction, "train", "validation", salt="validation")
    return disjoint_texts(DomainPrompts(*([p for p in prompts if p.split == name] for name in SPLITS)),
                          domain_cfg.name)


def text_key(prompt: Prompt) -> tuple[str, ...]:
    """What makes two prompts one, whatever their ids: their user turns, ignoring case, spacing and punctuation."""
    return tuple(normal_form(text) or " ".join(text.split()) for text in user_turns(messages_of(prompt)))


def disjoint_texts(split: DomainPrompts, domain: str) -> DomainPrompts:
    """The splits with a validation prompt that repeats a training prompt's text, and a held-out prompt that
    repeats a training or validation prompt's (under another id), left out of their split with a warning: what is
    measured as unseen stays unseen. Repeats within a split are kept."""
    seen = {text_key(prompt) for prompt in split.train}
    validation = [prompt for prompt in split.validation if text_key(prompt) not in seen]
    seen |= {text_key(prompt) for prompt in validation}
    heldout = [prompt for prompt in split.heldout if text_key(prompt) not in seen]
    for name, before, after in (("validation", split.validation, validation), ("held-out", split.heldout, heldout)):
        if len(after) < len(before):
            log.warning("domain %s: %d %s prompts repeat the text of a training%s prompt under another id and are "
                        "left out of %s, which stays unseen", domain, len(before) - len(after), name,
                        "" if name == "validation" else " or validation", name)
    return DomainPrompts(split.train, validation, heldout)


def free_of_control_tokens(prompts: DomainPrompts, tokenizer, system_prompt: str | None) -> DomainPrompts:
    """The domain's prompts once the target's tokenizer is known, none holding a control token of its chat template
    (distill/control_tokens.py): the domain's own prompts and system prompt are refused (PromptError, ConfigError),
    the extra prompts (served traffic) dropped with a warning."""
    check_system_prompt(system_prompt, tokenizer)
    return DomainPrompts(*(without_control_tokens(prompts_of_split, tokenizer,
                                                  lambda prompt: prompt.id.startswith(EXTRA_ID_PREFIX))
                           for prompts_of_split in (prompts.train, prompts.validation, prompts.heldout)))


def with_extra_training_prompts(split: DomainPrompts, extra: list[Prompt]) -> DomainPrompts:
    """The extra prompts train, ahead of the source's own (so that max_train_prompts keeps them), with their served
    responses; one that repeats a training prompt (ignoring case, spacing and punctuation) is left out. One that is
    also a validation or held-out prompt leaves that split, which stays unseen."""
    known = {text_key(prompt) for prompt in split.train}
    kept = []
    for prompt in extra:
        key = text_key(prompt)
        if key not in known:
            kept.append(replace(prompt, id=f"{EXTRA_ID_PREFIX}{prompt.id}", split="train"))
            known.add(key)
    unseen = [[prompt for prompt in prompts if text_key(prompt) not in known]
              for prompts in (split.validation, split.heldout)]
    moved = len(split.validation) + len(split.heldout) - sum(map(len, unseen))
    if moved:
        log.info("%d extra training prompts were validation or held-out prompts: they leave those splits", moved)
    return DomainPrompts(kept + split.train, *unseen)


# Mixes ------------------------------------------------------------------------------------------------------

def normal_form(text: str) -> str:
    """Lower-case words alone: prompts that differ only in case, spacing or punctuation are one prompt."""
    return " ".join(re.findall(r"\w+", text.lower()))


def interleave(groups: list[list[Prompt]]) -> list[Prompt]:
    """The groups' prompts taken one from each in turn (a group that runs out drops out), each group in its own
    order: any first n hold as many of each group as it can give, within one."""
    return [prompt for row in itertools.zip_longest(*groups) for prompt in row if prompt is not None]


def component_of(prompt: Prompt) -> str:
    """The component of a mix that a mixed prompt comes from: its id's prefix (`code/code-0001` -> code)."""
    return prompt.id.split("/", 1)[0]


def mixed_prompts(domain_cfg: DomainConfig) -> DomainPrompts:
    """A domain of source mix: the prompts of the domains named in domain.mix, each loaded as `+domain=<name>`
    loads it and keeping its own splits (train from its train, validation from its validation, held-out from its
    held-out: a shipped domain's held-out stays disjoint from its training prompts by template). Ids are prefixed
    by the component (`code/code-0001`), so answers and splits never collide. Every split takes one prompt from
    each component in turn, so that generate.max_train_prompts (and max_validation_prompts, eval.max_prompts) keep
    as many of each and no domain is crowded out. The held-out split is the union of the components'; a training
    or validation prompt that is also a held-out one (ignoring case, spacing and punctuation) leaves its split, so
    that the held-out stays unseen. The target-written prompts (domain.magpie_prompts) join the training split
    once the target is loaded: distill/magpie.py with_target_written_prompts."""
    name, names = domain_cfg.name, list(domain_cfg.mix or [])
    if not names:
        raise PromptError(f"domain {name}: source mix needs domain.mix, the domains to mix, e.g. "
                          f"domain.mix=[{','.join(shipped_domains())}]")
    repeated = sorted(component for component, count in Counter(names).items() if count > 1)
    if repeated:
        raise PromptError(f"domain {name}: domain.mix names {repeated} more than once")
    if name in names:
        raise PromptError(f"domain {name}: domain.mix cannot include the mix itself ({name})")
    if MAGPIE_COMPONENT in names:
        raise PromptError(f"domain {name}: domain.mix names {MAGPIE_COMPONENT!r}; the target-written prompts of a "
                          f"mix are set by domain.magpie_prompts")
    if domain_cfg.magpie_prompts is not None and domain_cfg.magpie_prompts < 0:
        raise ConfigError(f"domain.magpie_prompts must be >= 0 for source mix (0: none; null: one component's share "
                          f"of generate.max_train_prompts), got {domain_cfg.magpie_prompts}")
    if domain_cfg.magpie_prompts != 0:
        check_magpie_settings(replace(domain_cfg, magpie_prompts=domain_cfg.magpie_prompts or 1))
    components = []
    for component in names:
        settings = _component_settings(domain_cfg, component)
        split = load_domain_prompts(settings)
        components.append([[replace(prompt, id=f"{component}/{prompt.id}") for prompt in prompts]
                           for prompts in (split.train, split.validation, split.heldout)])
    heldout = interleave([splits[2] for splits in components])
    held_out = {normal_form(prompt.text) for prompt in heldout}
    validation = [p for p in interleave([splits[1] for splits in components]) if normal_form(p.text) not in held_out]
    unseen = held_out | {normal_form(prompt.text) for prompt in validation}
    train = [p for p in interleave([splits[0] for splits in components]) if normal_form(p.text) not in unseen]
    left = sum(len(splits[0]) + len(splits[1]) for splits in components) - len(train) - len(validation)
    if left:
        log.info("domain %s: %d training or validation prompts of one component are held-out (or validation) "
                 "prompts of another: they leave that split", name, left)
    return DomainPrompts(train, validation, heldout)


def _component_settings(mix: DomainConfig, component: str) -> DomainConfig:
    settings = domain_config(component)
    if settings.source == "shipped" and component not in shipped_domains():
        raise PromptError(f"domain {mix.name}: domain.mix names {component!r}, which is no domain: there is no "
                          f"conf/domain/{component}.yaml and no shipped prompts of that name; shipped: "
                          f"{shipped_domains()}")
    if settings.source == "mix":
        raise PromptError(f"domain {mix.name}: domain.mix names {component!r}, itself a mix (source mix): name its "
                          f"domains instead ({list(settings.mix)})")
    if settings.source == "magpie":
        raise PromptError(f"domain {mix.name}: domain.mix names {component!r}, of source magpie: a mix's "
                          f"target-written prompts are set by its own domain.magpie_prompts (and train only)")
    if settings.system_prompt != mix.system_prompt:
        raise PromptError(f"domain {mix.name}: domain.mix names {component!r}, whose system prompt "
                          f"({settings.system_prompt!r}) is not the mix's ({mix.system_prompt!r}): every prompt of a "
                          f"mix is answered and measured under the mix's domain.system_prompt")
    return settings


def with_train_component(prompts: DomainPrompts, component: str, added: list[Prompt]) -> DomainPrompts:
    """A mix's prompts with one more component that only ever trains (the target-written prompts), its ids
    prefixed by the component and taken in turn with the other components' training prompts (after the extra
    prompts, which stay first). One that repeats a prompt of any split (ignoring case, spacing and punctuation)
    is dropped, so that no held-out or validation prompt is trained on."""
    known = {normal_form(prompt.text) for split in (prompts.train, prompts.validation, prompts.heldout)
             for prompt in split}
    kept = []
    for prompt in added:
        key = normal_form(prompt.text)
        if key and key not in known:
            kept.append(Prompt(f"{component}/{prompt.id}", prompt.text, "train", prompt.messages))
            known.add(key)
    if len(kept) < len(added):
        log.info("%d of the %d %s prompts repeat a prompt of the mix and are left out", len(added) - len(kept),
                 len(added), component)
    extra = list(itertools.takewhile(lambda prompt: prompt.id.startswith(EXTRA_ID_PREFIX), prompts.train))
    groups: dict[str, list[Prompt]] = {}
    for prompt in prompts.train[len(extra):]:
        groups.setdefault(component_of(prompt), []).append(prompt)
    groups.setdefault(component, []).extend(kept)
    return DomainPrompts(extra + interleave(list(groups.values())), prompts.validation, prompts.heldout)


def component_share(domain_cfg: DomainConfig, max_train_prompts: int) -> int:
    """One component's share of max_train_prompts in a mix of domain.mix and the target-written prompts."""
    return -(-max_train_prompts // (len(domain_cfg.mix) + 1))


def components_count(prompts: list[Prompt]) -> dict[str, int]:
    """A mixed split's prompts per component, in order of first appearance."""
    return dict(Counter(component_of(prompt) for prompt in prompts))


def _existing_file(path) -> Path:
    if not path:
        raise PromptError("domain.path is required for source jsonl/parquet")
    path = Path(path).expanduser()
    if not path.is_file():
        raise PromptError(f"prompt file not found: {path}")
    return path


def _table_prompts(domain_cfg, prompt_field: str, split_field: str, id_field: str) -> list[Prompt]:
    if domain_cfg.source == "parquet":
        path = _existing_file(domain_cfg.path)
        table, where = datasets.Dataset.from_parquet(str(path)), str(path)
    else:
        where = f"dataset {domain_cfg.path}"
        table = datasets.load_dataset(domain_cfg.path, split=domain_cfg.hf_split)
    if prompt_field not in table.column_names:
        raise PromptError(f"{where}: no column {prompt_field!r} (columns: {table.column_names}); "
                          f"set domain.fields.prompt")
    prompts = []
    for row_number, row in enumerate(table, start=1):
        text = row[prompt_field]
        if not isinstance(text, str) or not text.strip():
            raise PromptError(f"{where}: row {row_number}: {prompt_field!r} must be a non-empty string")
        split = row.get(split_field) or "train"
        if split not in SPLITS:
            raise PromptError(f"{where}: row {row_number}: {split_field!r} must be one of {SPLITS}, got {split!r}")
        prompts.append(Prompt(str(row.get(id_field, f"{domain_cfg.name}-{row_number}")), text, split,
                              where=f"{where}: row {row_number}"))
    if not prompts:
        raise PromptError(f"{where}: no prompts")
    return prompts


def _conversation_prompts(domain_cfg) -> list[Prompt]:
    prompts = []
    for conversation in read_conversations(domain_cfg.path, domain_cfg.name, domain_cfg.hf_split):
        if conversation.split not in SPLITS:
            raise PromptError(f"{conversation.where}: field 'split' must be one of {SPLITS}, got {conversation.split!r}")
        prompts.append(Prompt(conversation.id, user_turns(conversation.messages)[0], conversation.split,
                              conversation.messages, where=conversation.where))
    return prompts


def _hash_split(prompts: list[Prompt], fraction: float, source_split: str, new_split: str,
                salt: str = "") -> list[Prompt]:
    """Move about `fraction` of the prompts of source_split to new_split, chosen by a hash of their id."""
    if not 0 < fraction < 1:
        raise PromptError(f"heldout_fraction must be in (0, 1), got {fraction}")

    def chosen(prompt: Prompt) -> bool:
        digest = hashlib.sha256((salt + prompt.id).encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < fraction

    return [replace(p, split=new_split) if p.split == source_split and chosen(p) else p for p in prompts]
