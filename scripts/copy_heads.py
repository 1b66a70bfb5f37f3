"""Which of a model's attention heads can copy its context, and which target layers a derived draft should keep.

    python scripts/copy_heads.py                               # the default target's heads
    python scripts/copy_heads.py --draft-layers 4              # and the best 4-layer drafts to derive from it
    python scripts/copy_heads.py --model outputs/code/distill-<hash>/draft   # a trained draft's heads

On rows of random tokens read twice, each head is scored by where its attention goes from the second reading:
an induction head looks at the token after the current token's first occurrence (what lets a model repeat what it
has read), a previous-token head at the token just before (what an induction head's keys are built from). The
model's own repeat accuracy (its most likely token right on the second reading) closes the list.

With --draft-layers N it derives, for every induction head the target has and every previous-token head before it,
the draft of N layers `pair.draft.derive_layers=[0, ..., N - 3, previous, induction]` (the first layers, then the
pair), and ranks them by how much of the induction head's attention survives in the derived draft, before any
training: a copying circuit to train from rather than one to grow.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from decode.config import DEFAULT_TARGET
from decode.models import ModelSpec, derive_draft, load_model

INDUCTION = 0.2  # a head whose mean attention to the token after the first occurrence is above this is listed
PREVIOUS = 0.3  # a head whose mean attention to the token before is above this is listed


@dataclass
class HeadScore:
    layer: int
    head: int
    induction: float  # mean attention from a repeated token to the token after its first occurrence
    previous: float  # mean attention to the token just before


def repeated_rows(vocab_size: int, length: int, rows: int, seed: int) -> torch.Tensor:
    """Rows of `length` random tokens, each read twice; tokens from the middle of the vocabulary (ordinary
    words and pieces, no control tokens)."""
    generator = torch.Generator().manual_seed(seed)
    sequence = torch.randint(vocab_size // 100, vocab_size // 2, (rows, length), generator=generator)
    return torch.cat([sequence, sequence], dim=1)


def head_scores(attentions: tuple[torch.Tensor, ...], length: int) -> list[HeadScore]:
    """Each head's induction and previous-token score from its attention (rows, heads, 2 length, 2 length) over
    repeated_rows."""
    second = torch.arange(length + 1, 2 * length)  # repeated tokens whose first occurrence has a successor
    after_first = second - length + 1
    every = torch.arange(1, 2 * length)
    scores = []
    for layer, attention in enumerate(attentions):
        induction = attention[:, :, second, after_first].mean(dim=(0, 2))
        previous = attention[:, :, every, every - 1].mean(dim=(0, 2))
        scores += [HeadScore(layer, head, induction[head].item(), previous[head].item())
                   for head in range(attention.shape[1])]
    return scores


@torch.no_grad()
def score_model(model: torch.nn.Module, length: int = 50, rows: int = 8,
                seed: int = 0) -> tuple[list[HeadScore], float]:
    """(every head's scores, the model's repeat accuracy on the second reading)."""
    model.set_attn_implementation("eager")  # the attention weights; sdpa returns none
    ids = repeated_rows(model.config.vocab_size, length, rows, seed).to(model.device)
    output = model(input_ids=ids, output_attentions=True, use_cache=False)
    repeated = (output.logits[:, length:-1].argmax(-1) == ids[:, length + 1:]).float().mean().item()
    return head_scores(tuple(attention.float().cpu() for attention in output.attentions), length), repeated


def candidate_layers(scores: list[HeadScore], draft_layers: int) -> list[list[int]]:
    """[0, ..., draft_layers - 3, previous, induction] for each layer holding an induction head and each earlier
    layer (past the first ones) holding a previous-token head."""
    first = list(range(draft_layers - 2))
    induction_layers = sorted({score.layer for score in scores if score.induction > INDUCTION})
    previous_layers = sorted({score.layer for score in scores if score.previous > PREVIOUS})
    return [first + [previous, induction] for induction in induction_layers for previous in previous_layers
            if len(first) <= previous < induction]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=DEFAULT_TARGET, help="the model scored, as pair.target.path takes it")
    parser.add_argument("--model", help="score this model directory (a trained draft) instead of the target")
    parser.add_argument("--draft-layers", type=int, help="rank the drafts of this many layers to derive")
    parser.add_argument("--length", type=int, default=50, help="random tokens in a row, read twice")
    parser.add_argument("--rows", type=int, default=8)
    args = parser.parse_args(argv)
    if args.draft_layers is not None and args.draft_layers < 2:
        parser.error("--draft-layers must be at least 2: a previous-token layer and an induction layer")
    model = load_model(ModelSpec(path=args.model or args.target, dtype="float32"))
    scores, repeated = score_model(model, args.length, args.rows)
    print(f"{args.model or args.target}: heads with induction > {INDUCTION} or previous-token > {PREVIOUS} "
          f"(layer.head induction/previous)")
    for score in scores:
        if score.induction > INDUCTION or score.previous > PREVIOUS:
            print(f"  {score.layer}.{score.head} {score.induction:.2f}/{score.previous:.2f}")
    print(f"repeats a random row of {args.length} it has just read: its most likely token right {repeated:.2f} "
          f"of the time")
    if args.draft_layers is None:
        return
    ranked = []
    for layers in candidate_layers(scores, args.draft_layers):
        derived_scores, derived_repeated = score_model(derive_draft(model, layers), args.length, args.rows)
        ranked.append((max(score.induction for score in derived_scores), derived_repeated, layers))
    if not ranked:
        print(f"no layer holds both kinds of head: derive the first {args.draft_layers} layers")
        return
    print(f"{args.draft_layers}-layer drafts derived from it, untrained: the strongest induction head left, repeat")
    for induction, derived_repeated, layers in sorted(ranked, reverse=True):
        print(f"  pair.draft.derive_layers=[{','.join(map(str, layers))}]: {induction:.2f}, {derived_repeated:.2f}")


if __name__ == "__main__":
    main()
