"""A seeded fuzz test of the cache's reader (distill/generate.py load_cached_dataset, as the stages look answers up):
an entry of the target's answers truncated at random offsets, overwritten with random bytes, given a file of
another entry or replaced by another entry whole, its manifest edited or removed. Whatever was done, pyarrow is
never handed a damaged entry (it can crash the process on one), a damaged entry is never reused but logged and
removed, and an entry whose bytes are as written is reused."""

import json
import logging
import os
import random
import shutil
from pathlib import Path

import datasets
import pytest

from decode.sampling import SamplingParams
from distill.data import Prompt
from distill.generate import cache_key, generate_dataset, load_cached_dataset

SEED, CASES = 57, 48
SAMPLING = SamplingParams(temperature=1.0)
PROMPTS = [Prompt(f"p{i}", text, "train") for i, text in enumerate(["alpha", "beta gamma", "delta", "epsilon"])]
TARGETS = ("fuzz-target-a", "fuzz-target-b")
MANIFEST = "specdraft-entry.json"


@pytest.fixture(scope="module")
def entries(tiny_pair, tmp_path_factory):
    """target -> (its key, its entry's directory, a pristine copy outside the cache, its records)."""
    made = {}
    for target in TARGETS:
        generated = generate_dataset(tiny_pair, PROMPTS, "fuzz", target, SAMPLING, 6, 4, 0, None, 4)
        pristine = tmp_path_factory.mktemp("pristine") / target
        shutil.copytree(generated.directory, pristine)
        made[target] = (cache_key(target, "fuzz", PROMPTS, SAMPLING, 6, 0, None, 4), generated.directory, pristine,
                        generated.dataset.to_list())
    return made


def files(directory: Path) -> dict[str, bytes]:
    return {path.relative_to(directory).as_posix(): path.read_bytes() for path in directory.rglob("*")
            if path.is_file()}


def as_written(entry: Path, pristine: Path) -> bool:
    """Whether the entry holds the files written, byte for byte, and a manifest that says what the written one says
    of them (its layout may differ; what it records beyond the entry's name and files is not asked for here)."""
    found, written = files(entry), files(pristine)
    manifests = [found.pop(MANIFEST, None), written.pop(MANIFEST, None)]
    if found != written or None in manifests:
        return found == written and manifests[0] == manifests[1]  # a version that writes no manifest: no edits
    try:
        edited, original = (json.loads(manifest) for manifest in manifests)
    except ValueError:
        return False
    return isinstance(edited, dict) and all(edited.get(field) == original[field] for field in ("format", "entry",
                                                                                               "files"))


def damage(rng: random.Random, entry: Path, other: Path) -> str:
    """Damage the entry one way drawn by rng; -> what was done."""
    names = sorted(files(entry))
    way = rng.choice(["truncate", "overwrite", "swap", "foreign", "manifest"])
    if way == "truncate":
        name = rng.choice(names)
        content = (entry / name).read_bytes()
        cut = rng.randrange(len(content))
        (entry / name).write_bytes(content[:cut])
        return f"{name} cut at {cut} of {len(content)} bytes"
    if way == "overwrite":
        name = rng.choice(names)
        content = bytearray((entry / name).read_bytes())
        start, count = rng.randrange(len(content)), rng.randint(1, 64)
        for index in range(start, min(start + count, len(content))):
            content[index] ^= rng.randrange(1, 256)
        (entry / name).write_bytes(bytes(content))
        return f"{name}: {count} bytes overwritten at {start}"
    if way == "swap":
        name = rng.choice([name for name in names if (other / name).is_file()])
        shutil.copyfile(other / name, entry / name)
        return f"{name} from the other entry"
    if way == "foreign":
        shutil.rmtree(entry)
        shutil.copytree(other, entry)
        return "the other entry copied whole under this one's name"
    return edit_manifest(rng, entry, other)


def edit_manifest(rng: random.Random, entry: Path, other: Path) -> str:
    manifest = json.loads((entry / MANIFEST).read_text())
    edit = rng.choice(["entry", "checksum", "size", "drop a file", "remove"])
    name = rng.choice(sorted(manifest["files"]))
    if edit == "remove":
        (entry / MANIFEST).unlink()
        return "manifest removed"
    if edit == "entry":
        manifest["entry"] = other.name
    elif edit == "checksum":
        manifest["files"][name]["sha256"] = json.loads((other / MANIFEST).read_text())["files"].get(
            name, {"sha256": "0" * 64})["sha256"]
    elif edit == "size":
        manifest["files"][name]["bytes"] += rng.choice([-1, 1])
    else:
        del manifest["files"][name]
    (entry / MANIFEST).write_text(json.dumps(manifest))
    return f"manifest: {edit} ({name})"


def test_no_damaged_answer_entry_is_ever_parsed_or_reused_and_an_intact_one_is(entries, monkeypatch, caplog):
    key, entry, pristine, records = entries[TARGETS[0]]
    other = entries[TARGETS[1]][2]
    real_load = datasets.load_from_disk

    def guarded_load(path, *args, **kwargs):
        if not as_written(Path(path), pristine):
            raise AssertionError(f"pyarrow handed the damaged entry {path}")
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(datasets, "load_from_disk", guarded_load)
    rng, damaged = random.Random(SEED), 0
    for case in range(CASES):
        if os.path.lexists(entry):
            shutil.rmtree(entry)
        shutil.copytree(pristine, entry)
        done = damage(rng, entry, other)
        intact = as_written(entry, pristine)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            found = load_cached_dataset("fuzz", key)
        if intact:
            assert found is not None and found.to_list() == records, f"case {case}: {done}"
            continue
        damaged += 1
        assert found is None and f"the cache entry {entry} cannot be reused" in caplog.text, f"case {case}: {done}"
        assert not os.path.lexists(entry), f"case {case}: {done}: left in place"
    assert damaged >= CASES * 3 // 4  # the cases damage, rarely by chance not
