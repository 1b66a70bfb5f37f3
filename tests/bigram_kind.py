"""A toy draft kind, written against the seam alone (decode/kinds/base.py and the shared bases in
decode/kinds/common/): a learnable bigram table whose logits for the next token are the row of the previous token.
No engine serves it; it trains, decodes exactly and exports its weights. tests/test_draft_kinds.py registers it
with one line."""

from __future__ import annotations

import copy
import json
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from decode.errors import ExportMismatch, PairError
from decode.export.job import ExportJob, RoundTrip, WrittenDraft, save_target_tokenizer
from decode.export.export_record import DraftRecord
from decode.files import published
from decode.kinds.base import DraftKind, DraftStep, KindSettings, TrainingObjective
from decode.kinds.common.token_drafter import TokenDrafter
from decode.models import ModelSpec, locate, resolve_dtype
from decode.figures import EngineCommands
from decode.runner import CausalLMRunner

NAME = "bigram"
WEIGHTS = "model.safetensors"


class BigramDraft(nn.Module):
    def __init__(self, vocab_size: int, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.table = nn.Parameter(torch.randn(vocab_size, vocab_size, generator=generator) * 0.1)  # [prev, next]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B, T] -> next-token logits [B, T, V]."""
        return F.embedding(input_ids, self.table)


class BigramRunner(CausalLMRunner):
    """No cache: a position's logits depend on its own token alone."""

    def __init__(self, draft: BigramDraft, vocab_size: int):
        self.draft, self.vocab_size = draft, vocab_size
        self.device, self.dtype = draft.table.device, draft.table.dtype

    def reset(self, batch_size: int, max_len: int) -> None:
        pass

    @torch.no_grad()
    def forward(self, tokens, start, kv_len, logits_at=None):
        if logits_at is not None:
            tokens = tokens.gather(1, logits_at)
        return self.draft(tokens)[..., : self.vocab_size]


class BigramObjective(TrainingObjective):
    def __init__(self, draft: BigramDraft, vocab_size: int):
        self.module, self.vocab_size = draft, vocab_size

    def training_steps(self, module, batch, autocast):
        with autocast():
            return [DraftStep(module(batch["input_ids"]))]

    def validation_steps(self, module, batch, autocast):
        with autocast():
            return [DraftStep(module(batch["input_ids"])[..., : self.vocab_size])]

    def bf16_probe(self, module, probe_batch, device):
        ids = torch.randint(self.vocab_size, probe_batch, generator=torch.Generator().manual_seed(0)).to(device)
        return (lambda: module(ids).float().logsumexp(-1).mean().backward()), module.table.shape[1]

    def trained_draft(self, module):
        return module

    def decoding_draft(self, module):
        return nullcontext(module)


def save_bigram(draft: BigramDraft, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"specdraft_kind": NAME, "vocab_size": draft.table.shape[0]}))
    save_file({"table": draft.table.detach().contiguous().cpu()}, str(directory / WEIGHTS))


def load_bigram(directory: str, dtype: torch.dtype, device) -> BigramDraft:
    table = load_file(str(Path(directory, WEIGHTS)))["table"]
    draft = BigramDraft(table.shape[0])
    draft.table.data = table
    return draft.to(dtype=dtype, device=device).eval()


@dataclass
class SameWeights:
    """The exported table read back: export.json's same_weights_<format>."""

    same_weights: bool


class BigramKind(DraftKind[KindSettings]):
    name = NAME
    title = "bigram table"

    def holds(self, draft):
        return isinstance(draft, BigramDraft)

    def found_at(self, spec: ModelSpec) -> bool:
        try:
            config = Path(locate(spec)[0], "config.json")
        except PairError:
            return False
        return config.is_file() and json.loads(config.read_text()).get("specdraft_kind") == NAME

    def load(self, target, target_tokenizer, spec: ModelSpec, settings):
        device = torch.device(spec.device)
        dtype = resolve_dtype(spec.dtype, device)
        if spec.path:
            return load_bigram(locate(spec)[0], dtype, device), target_tokenizer
        return BigramDraft(len(target_tokenizer)).to(dtype=dtype, device=device).eval(), target_tokenizer

    def check_pair(self, target, draft, target_tokenizer, draft_tokenizer, check_chat_template):
        if draft.table.shape[0] < len(target_tokenizer):
            raise PairError(f"the bigram table knows {draft.table.shape[0]} tokens, the tokenizer "
                            f"{len(target_tokenizer)}")

    def runner(self, draft, target, vocab_size, backend):
        return BigramRunner(draft, vocab_size)

    def drafter(self, runner):
        return TokenDrafter(runner)  # a model of its own: it reads the tokens

    def starting_draft(self, pair, method, settings, draft_vocabulary, seed):
        return copy.deepcopy(pair.draft).float().train()

    def objective(self, draft, pair, method, settings, device):
        return BigramObjective(draft, pair.vocab_size)

    def draft_vocab_size(self, draft, vocab_size):
        return None

    def save(self, draft, ctx, gamma):
        if ctx.is_main_process:
            with published(ctx.draft_dir, directory=True) as staging:
                save_bigram(draft.to(dtype=next(ctx.pair.target.parameters()).dtype), staging)
        ctx.accelerator.wait_for_everyone()

    def export(self, job: ExportJob, staging: Path) -> WrittenDraft:
        """No engine serves a bigram table: the weights alone, read back before they land."""
        trained = job.ctx.load_trained_draft()
        save_bigram(trained, staging / "draft")
        save_target_tokenizer(job.ctx, staging / "draft")
        reread = load_bigram(str(staging / "draft"), trained.table.dtype, trained.table.device)
        if not torch.equal(reread.table, trained.table):
            raise ExportMismatch("the exported bigram table reads back with other weights")
        return WrittenDraft(EngineCommands(), RoundTrip({"hf": SameWeights(True)}),
                            DraftRecord(draft_kind=NAME, draft_vocab_size=None, files={}))
