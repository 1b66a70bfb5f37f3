"""The target's teacher-forced labels: at each token of a sequence from a start on, the target's k most likely
tokens there with their log-probabilities, given the tokens before it. Every source of training data but the
answers' own labels goes through one of these (the prompts' tokens, code and corpus excerpts, served responses,
random sequences read twice):

    labels = target_labels(settings, runner_of, served)
    per_sequence = labels(sequences, starts, k, "code excerpts")   # -> [(top ids [n, k], top log p [n, k])]

InProcessLabels (distill/generate.py): the target loaded here, one forward per batch (top_k_labels).
ServerLabels (generate.labels=server): the serving engines at generate.server_url and generate.server_urls, one
request a sequence (vLLM's prompt_logprobs; llama-server one request a position), shared between the servers and
kept in shards as they come (distill/sharded_requests.py), so that a killed labelling job resumes.

`label_difference` compares the two on a few sequences, so a run says how far the server's labels are from the
target's own (float noise where the server serves the target in the same precision).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from decode.examples import top_k_arrays
from decode.precision import Precision
from distill.answers_from_server import SERVER, ServedAnswers, entry_arrays
from distill.generate import InProcessLabels
from distill.sharded_requests import run_sharded

log = logging.getLogger(__name__)


class ServerLabels:
    """Labels from the servers `served` asks (generate.labels=server), a request a sequence."""

    in_process = False

    def __init__(self, served: ServedAnswers):
        self.served = served

    @property
    def source(self) -> str:
        return self.served.source

    def ready(self) -> None:
        pass

    def __call__(self, sequences: list[list[int]], starts: list[int], k: int,
                 description: str = "labels") -> list[tuple[np.ndarray, np.ndarray]]:
        labels = [top_k_arrays([], []) for _ in sequences]
        items = [index for index in range(len(sequences)) if 0 < starts[index] < len(sequences[index])]
        if not items:
            return labels
        store = self.served.store("labels", [[sequences[index] for index in items],
                                             [starts[index] for index in items], k])
        servers = self.served.servers(max(len(sequences[index]) for index in items) + 1)

        def ask(index: int, client) -> dict:
            return entry_arrays(client.prompt_labels(sequences[index], starts[index], k))

        results = run_sharded(items, ask, servers, store, f"{description} from {len(servers.clients)} server(s)",
                              lambda result: len(result["top_ids"]), self.served.settings.server_retries)
        width = self.served.narrowest(results, k)
        for index, result in zip(items, results):
            labels[index] = top_k_arrays(result["top_ids"][:, :width], result["top_logprobs"][:, :width])
        return labels


def target_labels(settings, runner_of, served: ServedAnswers | None, precision: Precision | None = None):
    """The labels generate.labels asks for: the servers' where it is `server` (served: what asks them), else the
    target's here (precision: of its labelling forward, where already measured)."""
    if settings.labels == SERVER:
        return ServerLabels(served)
    return InProcessLabels(runner_of, settings.autocast, precision)


@dataclass
class LabelDifference:
    sequences: int
    positions: int
    top1_agreement: float  # of the positions, those whose most likely token is the same
    overlap: float  # of the k listed tokens, the share both list (averaged over positions)
    max_abs: float  # the largest |log p difference| of a token both list
    mean_abs: float

    def line(self, source: str) -> str:
        return (f"labels from {source} against the target here (float32) on {self.sequences} sequences "
                f"({self.positions} tokens): the same most likely token at {100 * self.top1_agreement:.1f}% of them, "
                f"{100 * self.overlap:.1f}% of the top-k tokens listed by both, |difference of log p| of a token "
                f"both list: max {self.max_abs:.2e}, mean {self.mean_abs:.2e}")


def label_difference(server: list[tuple[np.ndarray, np.ndarray]],
                     here: list[tuple[np.ndarray, np.ndarray]]) -> LabelDifference:
    """How far the server's labels are from the target's own on the same sequences (both as the labellers give)."""
    positions = agree = 0
    overlaps, differences = [], []
    for (server_ids, server_logprobs), (here_ids, here_logprobs) in zip(server, here):
        width = min(server_ids.shape[1] if server_ids.size else 0, here_ids.shape[1] if here_ids.size else 0)
        for row in range(min(len(server_ids), len(here_ids))):
            positions += 1
            agree += int(server_ids[row, 0] == here_ids[row, 0])
            listed_here = dict(zip(here_ids[row, :width].tolist(), here_logprobs[row, :width].tolist()))
            shared = [(listed_here[token], log_prob) for token, log_prob
                      in zip(server_ids[row, :width].tolist(), server_logprobs[row, :width].tolist())
                      if token in listed_here]
            overlaps.append(len(shared) / max(width, 1))
            differences += [abs(a - b) for a, b in shared]
    return LabelDifference(len(server), positions, agree / max(positions, 1), float(np.mean(overlaps or [0.0])),
                           max(differences, default=0.0), float(np.mean(differences or [0.0])))
