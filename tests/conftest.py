import logging
import os

import pytest
import torch

from decode.models import ModelSpec
from decode.pair import load_pair
from decode.serving.llama_server import ServerError, find_binary
from decode.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Tests write converted models under a temporary cache, never the user's."""
    previous = os.environ.get("SPECDRAFT_CACHE")
    os.environ["SPECDRAFT_CACHE"] = str(tmp_path_factory.mktemp("specdraft-cache"))
    os.environ.setdefault("WANDB_MODE", "disabled")
    yield
    if previous is None:
        os.environ.pop("SPECDRAFT_CACHE", None)
    else:
        os.environ["SPECDRAFT_CACHE"] = previous


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """A command run in this process (its --help, main()) has Hydra give the root logger handlers on this test's
    captured streams, closed once it ends: they leave with the test, so later tests' logging still works."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in before and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def target64(tokenizer):
    """float64 so that argmax ties between cached and uncached forwards cannot flip greedy tokens."""
    return tiny_llama(len(tokenizer), num_layers=3, seed=1, init_std=0.1, dtype=torch.float64)


@pytest.fixture(scope="session")
def draft64(tokenizer):
    """An unrelated random draft: it disagrees with the target often, so rejections are exercised."""
    return tiny_llama(len(tokenizer), num_layers=1, seed=2, init_std=0.1, dtype=torch.float64)


@pytest.fixture(scope="module")
def tiny_pair():
    """The tiny random target and a draft of its first layer, in float32 on the CPU; one per test module."""
    return load_pair(ModelSpec(path="tiny-random", dtype="float32", device="cpu"),
                     ModelSpec(derive_layers=1, dtype="float32", device="cpu"))


@pytest.fixture(scope="session")
def server_binary():
    """llama-server from the serving extra: a serving test fails, never skips, when it is missing."""
    try:
        return find_binary()
    except ServerError as error:
        pytest.fail(f"the serving tests need llama-server: {error}")
