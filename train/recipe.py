"""The training loop: a draft learns the target's next-token distributions on the target's answers.

The target's distributions (its top-k log-probabilities at every answer token)
were recorded when it wrote the answers, so training needs no target forward.
Read top to bottom: draft forward, per-token loss against the recorded
distributions, masked sum divided by the answer tokens of the whole optimizer
step (so gradient accumulation and several processes weigh every token the
same), backward, clip, step. Checkpoints are written atomically and a rerun of
the same command resumes from the last one; a non-finite loss or gradient stops
before the update is applied. The draft's forward runs under bf16 autocast where
that was measured to pay (decode/precision.py); the loss is computed in float32.

With on-policy mixing, a share of every step's sequences are the current draft's own answers, scored by
the target (distill/on_policy.py): sampled afresh every `on_policy_every` steps, kept in the checkpoints.

One code path runs in one process, under DDP and under FSDP2 (`accelerate launch`, docs/distributed.md): the
processes split every step's sequences, and a checkpoint holds the full (unsharded) state, so a run resumes
under any number of processes and either kind of parallelism.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os
import shutil
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from decode.errors import ConfigError, TrainingDiverged
from decode.files import publish, remove_stale_staging
from decode.precision import choose_precision, cpu_bf16_speedup
from decode.sampling import SamplingParams, probs_from_logits
from distill.data import Example, collate
from distill.losses import LOSSES, coarse_grained, masked_sum
from distill.on_policy import OnPolicySampler
from train.batching import epoch_order
from train.config import MethodConfig

log = logging.getLogger(__name__)

PROBE_BATCH = (2, 64)  # sequences x tokens that `auto` times: a sixteenth of a default micro-batch
TRAINING_STATE = "training_state.pt"


def base_causal_lm(model):
    """The transformers causal LM inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class KeptRowsHead(nn.Module):
    """A pruned draft's output head while it trains: only the kept rows of the full head's weight.

    It replaces the model's head, so the forward still runs through the model (and through any DDP/FSDP
    wrapper); its `weight` is the full head's own parameter, tied to the embeddings, under the name the full
    head gives it (`lm_head.weight`): the model's tying, FSDP's grouping of tied weights and the checkpoints
    see the model they would see unpruned. The full head module is kept aside, unregistered, to go back.
    """

    def __init__(self, head: nn.Module, kept_ids: torch.Tensor):
        super().__init__()
        self.weight = head.weight
        self.register_buffer("kept_ids", kept_ids, persistent=False)
        object.__setattr__(self, "full_head", head)  # not a submodule: its weight is ours

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight[self.kept_ids])


def restore_full_head(causal_lm) -> nn.Module:
    """Put a pruned draft's full output head back in place, with the weight it trained; returns the head that
    was there."""
    head = causal_lm.get_output_embeddings()
    if isinstance(head, KeptRowsHead):
        head.full_head.weight = head.weight
        causal_lm.set_output_embeddings(head.full_head)
    return head


def use_fsdp_on_cpu(accelerator) -> None:
    """`accelerate launch --use_fsdp --fsdp_version 2` (or a config file saying so) on CPU processes: accelerate
    keeps FSDP for accelerators and silently falls back to MULTI_CPU (DDP over gloo, the draft replicated).
    This turns accelerate's own FSDP2 path back on over the same gloo process group, so that the CPU processes
    run what GPU processes run: parameters, gradients and optimizer state sharded as DTensors, accelerate's
    prepare, no_sync and gradient clipping. FSDP1 is refused: torch's FSDP1 rejects accelerate's CPU device."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    asked = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if not asked or accelerator.distributed_type != DistributedType.MULTI_CPU:
        return
    if os.environ.get("FSDP_VERSION", "1") != "2":
        raise ConfigError("FSDP on CPU processes runs only as FSDP2: add --fsdp_version 2 to accelerate launch "
                          "(or fsdp_version: 2 to its config file)")
    # accelerate keeps the type in two shared states: the accelerator's, and the one every new PartialState reads
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
    accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin()  # from launch's FSDP_* variables
    log.warning("FSDP2 on %d CPU processes over gloo (accelerate itself runs FSDP only on accelerators)",
                accelerator.num_processes)


def is_sharded(accelerator) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.FSDP


def sharding_summary(model: nn.Module) -> str:
    """How much of the model this process holds: what tells sharded weights from replicated ones."""
    from torch.distributed.tensor import DTensor, Shard

    params = list(model.parameters())
    sharded = [p for p in params if isinstance(p, DTensor) and any(isinstance(at, Shard) for at in p.placements)]
    held = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)
    return (f"{len(sharded)} of {len(params)} parameters sharded, {held} of their {sum(p.numel() for p in params)} "
            f"elements held here")


def meta_copy(module: nn.Module) -> nn.Module:
    """A deep copy of `module` whose parameters are on the meta device (no memory; ties kept), buffers copied:
    the unsharded model a sharded one's gathered weights go back into."""
    memo = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
            for p in module.parameters()}
    return copy.deepcopy(module, memo)


def fill_parameters(module: nn.Module, state: dict) -> None:
    """Give every parameter of `module` (a meta_copy) its value from a full state dict, keeping ties: every name
    of one parameter gets one new parameter."""
    filled = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if id(param) not in filled:
            filled[id(param)] = nn.Parameter(state[name].detach().clone(), requires_grad=param.requires_grad)
        owner, _, attribute = name.rpartition(".")
        module.get_submodule(owner)._parameters[attribute] = filled[id(param)]


def expected_acceptance(draft_logits: torch.Tensor, target_top_logprobs: torch.Tensor, target_top_ids: torch.Tensor,
                        sampling: SamplingParams, kept_index: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T] sum over the target's recorded top-k tokens of min(p, q), both under `sampling`: the chance the
    decoder accepts the draft's token there.

    A pruned draft's logits [B, T, K] cover its kept tokens alone (kept_index maps a vocabulary id to its column,
    -1 for the others): those others have q = 0, and top-k and top-p over the kept tokens give the very
    distribution they give over the whole vocabulary with the others at -inf (8,192 columns of 49,152 by default)."""
    target_probs = probs_from_logits(target_top_logprobs, sampling)
    draft_probs = probs_from_logits(draft_logits, sampling)
    if kept_index is None:
        return torch.minimum(target_probs, draft_probs.gather(-1, target_top_ids)).sum(-1)
    columns = kept_index[target_top_ids]
    draft_top_probs = draft_probs.gather(-1, columns.clamp(min=0)) * (columns >= 0)
    return torch.minimum(target_probs, draft_top_probs).sum(-1)


class DistillationRecipe:
    def __init__(self, settings: MethodConfig, seed: int, draft, vocab_size: int, pad_token_id: int,
                 train_examples: list[Example], validation_examples: list[Example], checkpoint_dir: Path,
                 accelerator, tracker, eval_sampling: SamplingParams, kept_ids: list[int] | None = None,
                 on_policy: OnPolicySampler | None = None):
        if settings.loss not in LOSSES:
            raise ValueError(f"unknown loss {settings.loss!r}; choose one of {sorted(LOSSES)}")
        if not train_examples:
            raise ValueError("no training examples: every prompt was longer than max_length, or none was given")
        self.settings = settings
        self.seed = seed
        self.accelerator = accelerator
        self.tracker = tracker
        self.vocab_size = vocab_size
        self.pad_token_id = pad_token_id
        self.train_examples = train_examples
        self.validation_examples = validation_examples
        self.checkpoint_dir = checkpoint_dir
        self.eval_sampling = eval_sampling
        self.loss_fn = LOSSES[settings.loss]
        use_fsdp_on_cpu(accelerator)
        self.sharded = is_sharded(accelerator)
        self._check_distribution(settings)
        log.info("training process %d of %d (%s)", accelerator.process_index, accelerator.num_processes,
                 accelerator.distributed_type.value)
        device = accelerator.device
        self.kept_ids = self.kept_index = None
        if kept_ids:  # a pruned draft: its logits index the kept tokens; kept_index maps vocabulary ids there
            self.kept_ids = torch.tensor(kept_ids, device=device)
            self.kept_index = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
            self.kept_index[self.kept_ids] = torch.arange(len(kept_ids), device=device)
            causal_lm = base_causal_lm(draft)
            causal_lm.set_output_embeddings(KeptRowsHead(causal_lm.get_output_embeddings(), self.kept_ids.cpu()))
        autocast, latest = settings.autocast, self._latest_checkpoint()
        if latest:  # a resumed run keeps the precision it started in, so that it ends as a run never stopped would
            autocast = json.loads((latest / "trainer_state.json").read_text()).get("autocast", autocast)
        self.precision = choose_precision(autocast, device.type, lambda: self._bf16_speedup(draft), "train")
        trainable = [p for p in draft.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=settings.lr, weight_decay=settings.weight_decay)
        self.examples_per_step = settings.micro_batch_size * settings.gradient_accumulation * \
            accelerator.num_processes
        self.on_policy = on_policy if settings.on_policy_fraction > 0 else None
        self.on_policy_per_step = 0
        if self.on_policy:
            if self.examples_per_step < 2:
                raise ValueError("on-policy mixing needs at least 2 sequences per step (method.micro_batch_size)")
            self.on_policy_per_step = min(max(round(settings.on_policy_fraction * self.examples_per_step), 1),
                                          self.examples_per_step - 1)
        self.on_policy_pool: list[Example] = []
        self.on_policy_refresh = -1  # which refresh the pool comes from
        self.on_policy_seconds, self.on_policy_samples = 0.0, 0
        # an epoch shows every target answer once; on-policy sequences come on top
        self.offline_per_step = self.examples_per_step - self.on_policy_per_step
        steps_per_epoch = math.ceil(len(train_examples) / self.offline_per_step)
        self.total_steps = settings.max_steps or settings.epochs * steps_per_epoch
        self.steps_per_epoch = steps_per_epoch
        self._order_of_epoch: tuple[int, list[int]] = (-1, [])
        # sharded, the trained weights are gathered into an unsharded copy of the draft to be saved
        self.unsharded = meta_copy(draft) if self.sharded else None
        if self.sharded:
            plugin = accelerator.state.fsdp_plugin
            # every process built the same draft: each keeps its own shard of it, no broadcast from the first
            # (accelerate's broadcast also fails on persistent buffers, as an EAGLE-3 head's vocabulary map)
            plugin.cpu_ram_efficient_loading = False
            if not self.fsdp_units_below_root:
                plugin.auto_wrap_policy = None
        self.draft, self.optimizer = accelerator.prepare(draft, optimizer)
        if self.sharded:
            log.info("FSDP process %d: %s", accelerator.process_index, sharding_summary(self.draft))
        # not prepared: accelerate would step it once per process; the checkpoints hold it
        self.scheduler = get_cosine_schedule_with_warmup(self.optimizer, min(settings.warmup_steps, self.total_steps),
                                                         self.total_steps)
        self.step = 0

    # an FSDP auto-wrap policy may make units of submodules (the draft's decoder layers); a model that reads
    # submodules' weights without calling them (the EAGLE-3 head) must be one unit
    fsdp_units_below_root = True

    def _check_distribution(self, settings: MethodConfig) -> None:
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type == DistributedType.DEEPSPEED:
            raise ConfigError("DeepSpeed is not supported by the training recipe: use FSDP (accelerate launch "
                              "--config_file conf/accelerate/fsdp.yaml, docs/distributed.md)")
        if self.sharded and settings.on_policy_fraction:
            raise ConfigError("method.on_policy_fraction is not supported under FSDP: each process samples its own "
                              "prompts with the draft, a different number of forwards each, which sharded weights "
                              "cannot serve; use DDP or one process")

    # ---- the loop -------------------------------------------------------------------------------
    def train(self) -> dict:
        self._resume()
        history, loss, postfix = {}, float("nan"), {}
        bar = tqdm(total=self.total_steps, initial=self.step, desc="train", unit="step",
                   disable=not self.accelerator.is_main_process)
        if self.step == 0 and self.validation_examples:
            history["validation_acceptance_start"] = self.validation_acceptance()
            self.tracker.log({"validation/expected_acceptance": history["validation_acceptance_start"]}, step=0)
        with bar:
            while self.step < self.total_steps:
                loss = self._optimizer_step(self._micro_batches(self.step))
                self.step += 1
                bar.update(1)
                postfix["loss"] = f"{loss:.4f}"
                self.tracker.log({"train/loss": loss, "train/lr": self.scheduler.get_last_lr()[0]}, step=self.step)
                if self.validation_examples and (self.step % self.settings.eval_every == 0
                                              or self.step == self.total_steps):
                    acceptance = self.validation_acceptance()
                    history["validation_acceptance_end"] = acceptance
                    self.tracker.log({"validation/expected_acceptance": acceptance}, step=self.step)
                    postfix["validation_acceptance"] = f"{acceptance:.3f}"
                    log.info("step %d: validation expected acceptance %.3f", self.step, acceptance)
                bar.set_postfix(postfix)
                if self.step % self.settings.checkpoint_every == 0 and self.step < self.total_steps:
                    self._save_checkpoint()
        history.update(steps=self.total_steps, final_loss=loss, **self.precision.summary())
        if self.on_policy:
            history.update(on_policy_samples=self.on_policy_samples,
                           on_policy_seconds=round(self.on_policy_seconds, 1))
        return history

    def _optimizer_step(self, micro_batches: list[dict]) -> float:
        accelerator = self.accelerator
        answer_tokens = torch.tensor(sum(int(b["loss_mask"].sum()) for b in micro_batches), device=accelerator.device)
        answer_tokens = accelerator.reduce(answer_tokens, reduction="sum").item()
        # DDP's all-reduce and FSDP's reduce-scatter average gradients over processes: scale by their number so
        # that the update is the gradient of (sum of token losses over the whole step) / (answer tokens in it)
        scale = accelerator.num_processes / max(answer_tokens, 1)
        step_loss = torch.zeros((), device=accelerator.device)
        for index, batch in enumerate(micro_batches):
            last = index == len(micro_batches) - 1
            with nullcontext() if last else accelerator.no_sync(self.draft):
                loss = masked_sum(self.per_token_loss(batch), batch["loss_mask"]) * scale
                accelerator.backward(loss)
            step_loss += loss.detach()
        step_loss = accelerator.reduce(step_loss, reduction="sum").item() / accelerator.num_processes
        if not math.isfinite(step_loss):
            raise TrainingDiverged(
                f"the loss became {step_loss} at step {self.step + 1}; nothing of that step was applied. "
                f"Last good checkpoint: {self._latest_checkpoint() or 'none yet'}. "
                f"Lower method.lr (now {self.settings.lr}) or check the training data.")
        # clipping with an infinite bound only measures the norm; a non-finite norm means a non-finite gradient
        gradient_norm = accelerator.clip_grad_norm_(self.draft.parameters(),
                                                    self.settings.max_grad_norm or float("inf"))
        if hasattr(gradient_norm, "full_tensor"):  # FSDP2: a DTensor replicated over the processes
            gradient_norm = gradient_norm.full_tensor()
        if not math.isfinite(float(gradient_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingDiverged(
                f"the gradient norm became {float(gradient_norm)} at step {self.step + 1} (loss {step_loss:.4f}); "
                f"nothing of that step was applied. Last good checkpoint: {self._latest_checkpoint() or 'none yet'}. "
                f"Lower method.lr (now {self.settings.lr}) or check the training data.")
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return step_loss

    def per_token_loss(self, batch: dict) -> torch.Tensor:
        """[B, T] loss of each position against the recorded target distribution (masked by the caller)."""
        with self.precision.autocast():
            logits = self.draft(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                use_cache=False).logits
        target_ids, cells = batch["target_ids"], None
        if self.kept_index is not None:  # target tokens outside the draft's vocabulary join the bucket
            target_ids = self.kept_index[target_ids]
            cells = target_ids >= 0
            target_ids = target_ids.clamp(min=0)
        target_log_probs, draft_log_probs = coarse_grained(batch["target_logprobs"], target_ids, logits, cells)
        return self.loss_fn(target_log_probs, draft_log_probs, **self.settings.loss_kwargs)

    def _bf16_speedup(self, draft) -> float | None:
        """A few forward+backward steps of the draft on a small random batch, float32 vs bf16 autocast;
        the mean over the processes, so that all of them choose alike."""
        device = self.accelerator.device
        ids = torch.randint(self.vocab_size, PROBE_BATCH, generator=torch.Generator().manual_seed(0)).to(device)

        def step():
            draft(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean().backward()

        speedup = cpu_bf16_speedup(step, math.prod(PROBE_BATCH), base_causal_lm(draft).config.hidden_size)
        draft.zero_grad(set_to_none=True)
        if speedup is None:  # the same on every process: the model's size decides it
            return None
        return self.accelerator.reduce(torch.tensor(speedup, device=device), reduction="mean").item()

    # ---- data order: a function of the step, so a resumed run sees the same batches ----------------
    def _micro_batches(self, step: int) -> list[dict]:
        epoch, index_in_epoch = divmod(step, self.steps_per_epoch)
        order = self._epoch_order(epoch)
        begin = index_in_epoch * self.offline_per_step
        chosen = [self.train_examples[order[(begin + i) % len(order)]] for i in range(self.offline_per_step)]
        chosen += self._on_policy_examples(step)
        mine = chosen[self.accelerator.process_index:: self.accelerator.num_processes]
        size = self.settings.micro_batch_size
        return [self._to_device(self._collate(mine[at: at + size])) for at in range(0, len(mine), size)]

    def _epoch_order(self, epoch: int) -> list[int]:
        if self._order_of_epoch[0] != epoch:
            lengths = [len(example.input_ids) for example in self.train_examples]
            self._order_of_epoch = (epoch, epoch_order(lengths, self.offline_per_step, self.seed * 1000 + epoch,
                                                       self.settings.group_by_length))
        return self._order_of_epoch[1]

    def _collate(self, examples: list[Example]) -> dict:
        return collate(examples, self.pad_token_id)

    # ---- on-policy sequences: the current draft's answers, refreshed every on_policy_every steps ------
    def _on_policy_examples(self, step: int) -> list[Example]:
        if not self.on_policy:
            return []
        refresh, offset = divmod(step, self.settings.on_policy_every)
        if refresh != self.on_policy_refresh:
            self._refresh_on_policy(refresh)
        begin = offset * self.on_policy_per_step
        pool = self.on_policy_pool
        return [pool[(begin + i) % len(pool)] for i in range(self.on_policy_per_step)]

    def _refresh_on_policy(self, refresh: int) -> None:
        """The draft as it is now answers the prompts of this refresh; each process samples its share."""
        began = time.perf_counter()
        accelerator = self.accelerator
        chosen = self.on_policy.prompts_for(refresh, self.on_policy_per_step * self.settings.on_policy_every)
        with self._draft_with_full_head() as draft:
            pool = self.on_policy.sample(draft, chosen[accelerator.process_index:: accelerator.num_processes],
                                         refresh)
        if accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            pool = gather_object(pool)
        if not pool:
            raise ValueError("no on-policy sequence fits method.max_length; raise it")
        self.on_policy_pool, self.on_policy_refresh = pool, refresh
        self.on_policy_samples += len(pool)
        self.on_policy_seconds += time.perf_counter() - began
        self.tracker.log({"train/on_policy_seconds": self.on_policy_seconds}, step=self.step)

    @contextmanager
    def _draft_with_full_head(self):
        """The unwrapped draft with its full output head, as the decoder runs it (a pruned draft's runner
        projects onto config.draft_vocab itself)."""
        draft = self.accelerator.unwrap_model(self.draft)
        causal_lm = base_causal_lm(draft)
        head = restore_full_head(causal_lm)
        try:
            yield draft
        finally:
            causal_lm.set_output_embeddings(head)

    def _to_device(self, batch: dict) -> dict:
        return {key: value.to(self.accelerator.device) for key, value in batch.items()}

    # ---- validation acceptance: sum min(p, q) under the decoder's own sampling settings ---------------
    @torch.no_grad()
    def validation_acceptance(self) -> float:
        """Mean over validation answer tokens of sum_x min(p(x), q(x)) under the decoder's sampling settings:
        the chance the decoder accepts the draft's token there (p over the target's recorded top-k)."""
        self.draft.eval()
        accepted, positions = 0.0, 0
        size = self.settings.micro_batch_size
        for at in range(0, len(self.validation_examples), size):
            batch = self._to_device(self._collate(self.validation_examples[at: at + size]))
            with self.precision.autocast():
                logits = self.draft(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                    use_cache=False).logits
            if self.kept_index is None:  # the head may have more rows than the vocabulary
                logits = logits[..., : self.vocab_size]
            per_position = expected_acceptance(logits, batch["target_logprobs"], batch["target_ids"],
                                               self.eval_sampling, self.kept_index)
            accepted += masked_sum(per_position, batch["loss_mask"]).item()
            positions += int(batch["loss_mask"].sum())
        self.draft.train()
        totals = self.accelerator.reduce(torch.tensor([accepted, positions], device=self.accelerator.device,
                                                      dtype=torch.float64), reduction="sum")
        return (totals[0] / totals[1]).item() if totals[1] else float("nan")

    def trained_draft(self):
        """The trained model, unwrapped, with its full output head back in place. Sharded (FSDP), every process
        must call it: the weights are gathered into an unsharded copy on the main process's CPU; the other
        processes get that copy with its parameters on the meta device (shapes, no values)."""
        draft = self._trained_model()
        restore_full_head(base_causal_lm(draft))
        return draft

    def _trained_model(self) -> nn.Module:
        if not self.sharded:
            return self.accelerator.unwrap_model(self.draft)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.draft, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.accelerator.is_main_process:
            fill_parameters(self.unsharded, state)
            self.unsharded.to("cpu")
        return self.unsharded

    # ---- checkpoints ------------------------------------------------------------------------------
    def _latest_checkpoint(self) -> Path | None:
        done = sorted(self.checkpoint_dir.glob("step-*"))
        return done[-1] if done else None

    def _save_checkpoint(self) -> None:
        """<checkpoint_dir>/step-<n>: training_state.pt (the full model and optimizer state keyed by parameter
        name, as one process holds them whatever the number of processes or the sharding; the scheduler),
        rng-<process>.pt, trainer_state.json; written in a staging directory and renamed into place."""
        accelerator = self.accelerator
        final = self.checkpoint_dir / f"step-{self.step:08d}"
        staging = self.checkpoint_dir / f".tmp-step-{self.step:08d}"
        if accelerator.is_main_process:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
        accelerator.wait_for_everyone()
        torch.save(self._rng_state(), staging / f"rng-{accelerator.process_index}.pt")
        state = self._training_state()  # gathered from every process onto the main one
        if accelerator.is_main_process:
            torch.save(state, staging / TRAINING_STATE)
            trainer = {"step": self.step, "autocast": self.precision.name, "processes": accelerator.num_processes}
            (staging / "trainer_state.json").write_text(json.dumps(trainer))
            if self.on_policy_pool:  # a resumed run goes on with the samples this one was training on
                (staging / "on_policy.json").write_text(json.dumps(
                    {"refresh": self.on_policy_refresh,
                     "examples": [dataclasses.asdict(example) for example in self.on_policy_pool]}))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            publish(staging, final)  # a checkpoint exists whole or not at all
            for old in sorted(self.checkpoint_dir.glob("step-*"))[: -self.settings.keep_checkpoints]:
                shutil.rmtree(old, ignore_errors=True)
        accelerator.wait_for_everyone()

    def _training_state(self) -> dict:
        """The model's and the optimizer's full state by parameter name (on the main process; the others get
        empty dicts when sharded) and the scheduler's: the same in one process, under DDP and under FSDP."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {"model": get_model_state_dict(self.draft, options=options),
                "optimizer": get_optimizer_state_dict(self.draft, self._torch_optimizer(), options=options),
                "scheduler": self.scheduler.state_dict()}

    def _load_training_state(self, checkpoint: Path) -> None:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)

        state = torch.load(checkpoint / TRAINING_STATE, map_location="cpu", weights_only=True)
        options = StateDictOptions(full_state_dict=True)  # every process reads the file and keeps its shard
        set_model_state_dict(self.draft, state["model"], options=options)
        set_optimizer_state_dict(self.draft, self._torch_optimizer(), state["optimizer"], options=options)
        self.scheduler.load_state_dict(state["scheduler"])
        saved = json.loads((checkpoint / "trainer_state.json").read_text()).get("processes")
        rng = checkpoint / f"rng-{self.accelerator.process_index}.pt"
        if saved == self.accelerator.num_processes and rng.is_file():  # else dropout masks differ anyway
            self._set_rng_state(torch.load(rng, weights_only=True))

    def _torch_optimizer(self) -> torch.optim.Optimizer:
        return getattr(self.optimizer, "optimizer", self.optimizer)  # inside accelerate's AcceleratedOptimizer

    @staticmethod
    def _rng_state() -> dict:
        state = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    @staticmethod
    def _set_rng_state(state: dict) -> None:
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])

    def _resume(self) -> None:
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        if self.accelerator.is_main_process:
            remove_stale_staging(self.checkpoint_dir)  # left by a run killed while saving
        self.accelerator.wait_for_everyone()
        latest = self._latest_checkpoint()
        if latest is None:
            return
        if not (latest / TRAINING_STATE).is_file():
            raise ConfigError(f"{latest} was written by an earlier version of specdraft (accelerate's checkpoint "
                              f"layout), which this one does not resume; remove {self.checkpoint_dir} to train "
                              f"from the start")
        self._load_training_state(latest)
        self.step = json.loads((latest / "trainer_state.json").read_text())["step"]
        if self.on_policy and (latest / "on_policy.json").is_file():
            saved = json.loads((latest / "on_policy.json").read_text())
            self.on_policy_pool = [Example(**example) for example in saved["examples"]]
            self.on_policy_refresh = saved["refresh"]
        log.info("resumed from %s (step %d of %d)", latest, self.step, self.total_steps)
