"""An independent draft (pair.draft.kind=causal_lm): a causal LM of its own over the target's tokenizer, loaded
from a path, built fresh or derived from the target's layers; served by every engine as a draft model."""

from __future__ import annotations

from torch import nn
from transformers import PreTrainedModel

from decode.kinds.base import KindSettings
from decode.kinds.common.model_draft import ModelDraftKind, marked_kind
from decode.kinds.independent.drafter import IndependentDrafter


class IndependentKind(ModelDraftKind[KindSettings]):
    name = "causal_lm"
    title = ""

    def holds(self, draft: nn.Module) -> bool:
        """Also a causal LM no kind has marked (made here rather than loaded)."""
        return isinstance(draft, PreTrainedModel) and marked_kind(draft) in (None, self.name)

    def found_at(self, spec) -> bool:
        """Never by its files: a causal LM may start a draft of any kind that builds on one."""
        return False

    def drafter(self, runner) -> IndependentDrafter:
        return IndependentDrafter(runner)
