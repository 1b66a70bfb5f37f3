"""The target's prefill of a generate call: its logits at each row's last prompt token, and with prompt labels asked
for, the top-k at the prompt tokens from its own forwards (where a separate teacher-forced pass would run the
prompts through the target again)."""

from __future__ import annotations

import torch

from decode.rows import Rows
from decode.runner import CausalLMRunner
from decode.top_k import TopKRecorder

LABEL_LOGITS_ELEMENTS = 1 << 25  # logits a labelling prefill computes at once (a chunk of positions x rows x vocab)


def prefill(target: CausalLMRunner, rows: Rows, recorder: TopKRecorder, shares_prompts: bool) -> torch.Tensor:
    """Resets the target's cache and reads the prompts -> the logits at each row's last prompt token [B, V].
    shares_prompts: a prompt given several times may be read once (answering alone, with a runner that copies
    cache rows)."""
    state = rows.state
    readers, reader_of = prompt_readers(rows, recorder.label_prompts_from, shares_prompts)
    target.reset(len(readers), rows.capacity)
    if recorder.label_prompts_from is None:
        lengths = state.lengths[readers]
        longest = int(lengths.max())
        start = torch.zeros(len(readers), dtype=torch.long, device=state.tokens.device)
        logits = target.forward(state.tokens[readers, :longest], start, longest, logits_at=(lengths - 1)[:, None])[:, 0]
        state.target_hidden = target.captured
    else:
        logits = labelling_prefill(target, rows, readers, recorder)
        state.target_hidden = None  # a drafter that reads the target's states is never given a labelling prefill
    if reader_of is not None:  # each answer's row takes its prompt's cache, logits and labels
        target.select_rows(reader_of)
        logits = logits[reader_of]
        recorder.select_rows(reader_of)
    return logits


def prompt_readers(rows: Rows, label_prompts_from, shares_prompts: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """-> the rows whose prompts the prefill reads, and for each row the index among them of the row that reads
    its prompt (None: every row reads its own). A prompt given several times (several answers to it) is read
    once, by the copy with the most labelled prompt tokens."""
    tokens, batch = rows.state.tokens, rows.state.batch
    every_row = torch.arange(batch, device=tokens.device)
    if not shares_prompts:
        return every_row, None
    prompts = [tuple(tokens[row, :length].tolist()) for row, length in enumerate(rows.prompt_lengths)]
    firsts = label_prompts_from or [0] * batch
    reader_of_prompt: dict[tuple, int] = {}
    for row in sorted(range(batch), key=lambda row: firsts[row]):
        reader_of_prompt.setdefault(prompts[row], row)
    if len(reader_of_prompt) == batch:
        return every_row, None
    readers = sorted(reader_of_prompt.values())
    index_of = {row: index for index, row in enumerate(readers)}
    reader_of = [index_of[reader_of_prompt[prompt]] for prompt in prompts]
    return torch.tensor(readers, device=tokens.device), torch.tensor(reader_of, device=tokens.device)


def labelling_prefill(target: CausalLMRunner, rows: Rows, readers: torch.Tensor,
                      recorder: TopKRecorder) -> torch.Tensor:
    """The prefill of the rows `readers` in chunks of positions whose logits all go through the head (a chunk's
    logits stay within LABEL_LOGITS_ELEMENTS), the top-k kept at each -> the logits at each row's last prompt
    token [len(readers), V]. Rows shorter than a chunk hold padding there: logits no row reads, keys the decode
    steps overwrite."""
    tokens = rows.state.tokens
    device = tokens.device
    count, lengths = len(readers), rows.state.lengths[readers]
    longest = int(lengths.max())
    first_read = min(recorder.label_prompts_from[row] for row in readers.tolist()) - 1  # predicts the earliest
    per_chunk = max(1, LABEL_LOGITS_ELEMENTS // (count * target.vocab_size))
    last = torch.zeros(count, target.vocab_size, device=device)
    bounds = ([(0, first_read)] if first_read else []) + [
        (begin, min(begin + per_chunk, longest)) for begin in range(first_read, longest, per_chunk)]
    for begin, end in bounds:
        start = torch.full((count,), begin, dtype=torch.long, device=device)
        read = torch.arange(end - begin, device=device).expand(count, -1) if begin >= first_read else \
            torch.full((count, 1), end - begin - 1, device=device)  # unread: the cheapest one position
        logits = target.forward(tokens[readers, begin:end], start, end, logits_at=read)
        if begin < first_read:
            continue
        recorder.record_prompt_chunk(logits)
        ends_here = (lengths - 1 >= begin) & (lengths - 1 < end)
        at_end = (lengths - 1 - begin).clamp(0, end - begin - 1)
        last = torch.where(ends_here[:, None], logits[torch.arange(count, device=device), at_end].float(), last)
    return last
