"""The draft as engines load it: HF safetensors with the target's tokenizer.

A pruned-vocabulary draft is written with a full-size, untied output head whose
pruned rows are zero (logit 0: engines without draft-vocabulary support give those
tokens a small q, which costs a little acceptance but never exactness), and with
`draft_vocab` in its config, which this project's decoder uses to make q exactly 0.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer

from decode.errors import ExportError
from decode.tokenizers import tokenizer_differences


def serving_copy(draft: torch.nn.Module) -> torch.nn.Module:
    """The draft as engines should load it: a pruned draft gets an untied full head with zero pruned rows."""
    kept = getattr(draft.config, "draft_vocab", None)
    if not kept:
        return draft
    head = draft.get_output_embeddings().weight.detach().clone()
    pruned = torch.ones(head.shape[0], dtype=torch.bool)
    pruned[torch.tensor(kept)] = False
    head[pruned] = 0.0
    draft.config.tie_word_embeddings = False
    draft.lm_head = torch.nn.Linear(head.shape[1], head.shape[0], bias=False, dtype=head.dtype, device=head.device)
    draft.lm_head.weight = torch.nn.Parameter(head)
    return draft


def check_tokenizer(exported_dir: Path, target_tokenizer) -> None:
    """The tokenizer saved with the draft must split text exactly as the target's."""
    exported = AutoTokenizer.from_pretrained(str(exported_dir))
    problems = tokenizer_differences(target_tokenizer, exported)
    if (exported.chat_template or None) != (target_tokenizer.chat_template or None):
        problems.append("the chat templates differ")
    if problems:
        raise ExportError("the exported tokenizer does not behave like the target's: " + "; ".join(problems))
