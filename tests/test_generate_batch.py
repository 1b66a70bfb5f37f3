"""generate's batch of answers (distill/generate.py answer_batch_size): on a CPU the batch whose decode step costs
least a row, a larger one only where it costs MIN_BATCH_GAIN times less; the runner's forwards are timed by a
clock that they advance themselves, so each case is exact."""

from types import SimpleNamespace

import pytest
import torch

import distill.generate as generate
from decode.precision import FLOAT32


class SteppedRunner:
    """A runner whose forward over `rows` rows takes step_seconds(rows) of the clock it is given."""

    def __init__(self, step_seconds, clock, device="cpu", hidden_size=576):
        self.step_seconds, self.clock, self.device = step_seconds, clock, torch.device(device)
        self.model = SimpleNamespace(config=SimpleNamespace(hidden_size=hidden_size))
        self.rows, self.freed = None, False

    def reset(self, rows, max_len):
        self.rows = rows

    def forward(self, tokens, start, kv_len, logits_at=None):
        assert tokens.shape == (self.rows, 1) and kv_len == generate.BATCH_PROBE_CONTEXT + 1
        self.clock[0] += self.step_seconds(self.rows)

    def free(self):
        self.freed = True


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(generate.time, "perf_counter", lambda: now[0])
    return now


@pytest.mark.parametrize("step_seconds, largest, chosen", [
    (lambda rows: 0.001 * rows, 128, 32),  # a row costs the same in any batch: the smallest
    (lambda rows: 0.05, 128, 128),  # the weights' reads alone: the largest
    (lambda rows: 0.05 + 0.000005 * rows ** 2, 128, 64),  # 64 rows 1.56x cheaper than 32, 128 1.07x than 64
    (lambda rows: 0.006 + 0.001 * rows, 64, 32),  # 64 rows cost 1.09x less a row: under MIN_BATCH_GAIN
])
def test_the_batch_is_the_cheapest_a_row_by_a_clear_margin(clock, step_seconds, largest, chosen):
    runner = SteppedRunner(step_seconds, clock)
    assert generate.answer_batch_size(runner, FLOAT32, 32, largest) == chosen
    assert runner.freed


def test_a_gpu_a_single_batch_size_or_a_model_too_small_to_time_is_not_timed(clock):
    def untimed(**settings):
        return SteppedRunner(lambda rows: pytest.fail("timed"), clock, **settings)

    assert generate.answer_batch_size(untimed(device="meta"), FLOAT32, 32, 64) == 64
    assert generate.answer_batch_size(untimed(), FLOAT32, 32, 32) == 32
    # the tiny test models: their steps take microseconds, and the batch would follow the machine's noise
    assert generate.answer_batch_size(untimed(hidden_size=64), FLOAT32, 32, 64) == 32
