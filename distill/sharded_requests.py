"""Long lists of requests to serving engines: several servers share them, and what they return is written a shard
at a time, so that a labelling job killed after days (kill -9, a lost node) resumes where it stopped.

    results = run_sharded(items, ask, servers, ShardStore(directory, len(items), shard_size), ...)

`ask(item, server)` sends one request to one server and returns the item's result as named numpy arrays. Items
are sent in order, each to the server with the fewest requests in flight (each holds at most `parallel`), and no
item more than one shard's length ahead of the oldest unfinished one: so at any moment the results not yet on
disk span at most one shard's worth of items, and a killed job loses at most that. A shard is written (to a
temporary name, then renamed) as soon as all its items are back; a rerun with the same store loads the shards on
disk and asks for the rest. A request that fails for a reason that may pass (the server unreachable, a timeout,
HTTP 429 or 5xx) is retried with back-off (1, 2, 4, ... s), on another server where there are several; any other
failure stops the job at once, and the shards written are kept.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zipfile
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from decode.errors import SpecdraftError

log = logging.getLogger(__name__)

SHARD_NAME = "shard-{:06d}.npz"
PROGRESS_EVERY_S = 30.0
BACKOFF_S, MAX_BACKOFF_S = 1.0, 30.0  # the first retry's wait, doubled each time up to the most


class Transient(SpecdraftError, RuntimeError):
    """A request failed in a way that may pass: retried, on another server where there are several."""


@dataclass
class ShardStore:
    """Results of `count` items, `shard_size` a shard, as .npz files under `directory` (no pickles: arrays only)."""

    directory: Path
    count: int
    shard_size: int

    def __post_init__(self):
        self.directory = Path(self.directory)
        if self.shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {self.shard_size}")

    @property
    def shards(self) -> int:
        return -(-self.count // self.shard_size)

    def items_of(self, shard: int) -> range:
        return range(shard * self.shard_size, min(self.count, (shard + 1) * self.shard_size))

    def path(self, shard: int) -> Path:
        return self.directory / SHARD_NAME.format(shard)

    def load(self, shard: int) -> list[dict[str, np.ndarray]] | None:
        """The shard's results in item order, or None where it is missing or unreadable (then asked for again)."""
        path = self.path(shard)
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as arrays:
                results = [{} for _ in self.items_of(shard)]
                for name in arrays.files:
                    index, key = name.split("/", 1)
                    results[int(index)][key] = arrays[name]
        except (OSError, ValueError, KeyError, IndexError, zipfile.BadZipFile) as error:
            log.warning("shard %s cannot be read (%s): its items are asked for again", path, error)
            return None
        return results if all(results) else None

    def write(self, shard: int, results: list[dict[str, np.ndarray]]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(shard)
        staging = path.with_name(path.name + f".{os.getpid()}.partial")
        with open(staging, "wb") as file:
            np.savez(file, **{f"{index}/{key}": value for index, result in enumerate(results)
                              for key, value in result.items()})
            file.flush()
            os.fsync(file.fileno())
        os.replace(staging, path)

    def remove(self) -> None:
        """The shards, once what they hold is kept elsewhere (the dataset in the cache)."""
        for path in self.directory.glob("shard-*"):
            path.unlink(missing_ok=True)
        try:
            self.directory.rmdir()
        except OSError:
            pass


@dataclass
class Servers:
    """The servers sharing the work, each with at most `parallel` requests in flight."""

    clients: Sequence
    parallel: int

    def __post_init__(self):
        self.in_flight = [0] * len(self.clients)
        self.served = [0] * len(self.clients)  # requests each answered
        self.lock = threading.Condition()

    def acquire(self, avoid: int | None = None) -> int:
        """The index of the least busy server with a free slot (another than `avoid` where there is one)."""
        with self.lock:
            while True:
                free = [i for i in range(len(self.clients)) if self.in_flight[i] < self.parallel]
                preferred = [i for i in free if i != avoid] or free
                if preferred:
                    chosen = min(preferred, key=lambda i: (self.in_flight[i], self.served[i]))
                    self.in_flight[chosen] += 1
                    return chosen
                self.lock.wait()

    def release(self, index: int, answered: bool) -> None:
        with self.lock:
            self.in_flight[index] -= 1
            self.served[index] += answered
            self.lock.notify_all()


def ask_with_retries(ask: Callable, item, servers: Servers, retries: int):
    """ask(item, client) on the least busy server; a Transient failure is retried up to `retries` times, each after
    a back-off of 1, 2, 4, ... s (at most MAX_BACKOFF_S) and on another server where there are several."""
    last = None
    for attempt in range(retries + 1):
        index = servers.acquire(avoid=last)
        try:
            result = ask(item, servers.clients[index])
        except Transient as error:
            servers.release(index, False)
            if attempt == retries:
                raise type(error)(f"{error} (after {retries + 1} attempts)") from None
            last = index
            delay = min(MAX_BACKOFF_S, BACKOFF_S * 2.0 ** attempt)
            log.warning("%s; retrying in %.0f s", error, delay)
            time.sleep(delay)
            continue
        except BaseException:
            servers.release(index, False)
            raise
        servers.release(index, True)
        return result


@dataclass
class Progress:
    """What a sharded job has done, logged at most every PROGRESS_EVERY_S seconds: items, tokens, rate, ETA."""

    description: str
    total: int
    resumed: int = 0
    done: int = 0
    tokens: int = 0
    began: float = field(default_factory=time.perf_counter)
    logged: float = field(default_factory=time.perf_counter)

    def add(self, items: int, tokens: int, force: bool = False) -> None:
        self.done, self.tokens = self.done + items, self.tokens + tokens
        now = time.perf_counter()
        if force or now - self.logged >= PROGRESS_EVERY_S:
            self.logged = now
            log.info("%s", self.line())

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self.began, 1e-9)
        left = self.total - self.resumed - self.done
        eta = elapsed * left / self.done if self.done else float("nan")
        return (f"{self.description}: {self.resumed + self.done}/{self.total} done"
                + (f" ({self.resumed} resumed from shards)" if self.resumed else "")
                + f", {self.tokens} tokens in {elapsed:.0f} s ({self.tokens / elapsed:,.1f} tok/s)"
                + (f", about {eta / 60:.1f} min left" if left and self.done else ""))


def run_sharded(items: list, ask: Callable, servers: Servers, store: ShardStore, description: str,
                tokens_of: Callable[[dict], int], retries: int = 5) -> list[dict[str, np.ndarray]]:
    """-> each item's result (named arrays), in order: those of the shards on disk loaded, the rest asked for
    (ask_with_retries), each shard written as soon as it is whole."""
    if len(items) != store.count:
        raise ValueError(f"{len(items)} items for a store of {store.count}")
    results: list = [None] * len(items)
    missing = []
    for shard in range(store.shards):
        loaded = store.load(shard)
        if loaded is None:
            missing.append(shard)
        else:
            for index, result in zip(store.items_of(shard), loaded):
                results[index] = result
    progress = Progress(description, len(items), resumed=len(items) - sum(len(store.items_of(s)) for s in missing))
    if progress.resumed:
        log.info("%s: resuming from %s: %d of %d shards (%d of %d items) were done", description, store.directory,
                 store.shards - len(missing), store.shards, progress.resumed, len(items))
    order = [index for shard in missing for index in store.items_of(shard)]
    if not order:
        return results
    window = store.shard_size  # no item sent more than a shard ahead of the oldest unfinished one
    left_in_shard = {shard: len(store.items_of(shard)) for shard in missing}
    with ThreadPoolExecutor(max_workers=servers.parallel * len(servers.clients)) as pool:
        pending: dict[Future, int] = {}
        next_position = 0
        try:
            while next_position < len(order) or pending:
                oldest = min(pending.values(), default=order[next_position] if next_position < len(order) else 0)
                while (next_position < len(order) and len(pending) < servers.parallel * len(servers.clients)
                       and order[next_position] < oldest + window):
                    index = order[next_position]
                    pending[pool.submit(ask_with_retries, ask, items[index], servers, retries)] = index
                    next_position += 1
                finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for future in finished:
                    index = pending.pop(future)
                    results[index] = future.result()
                    shard = index // store.shard_size
                    left_in_shard[shard] -= 1
                    if not left_in_shard[shard]:
                        store.write(shard, [results[i] for i in store.items_of(shard)])
                    progress.add(1, tokens_of(results[index]))
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    progress.add(0, 0, force=True)
    return results
