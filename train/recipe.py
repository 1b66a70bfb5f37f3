"""The training loop: a draft learns the target's next-token distributions on the target's answers.

What the draft computes from a batch comes from its kind's objective (decode/kinds/base.py: TrainingObjective):
one or more draft steps of logits, each scored against the target's distribution recorded where its token is.

The target's distributions (its top-k log-probabilities at every answer token)
were recorded when it wrote the answers, so training needs no target forward.
Read top to bottom: draft forward, per-token loss against the recorded
distributions, masked sum divided by the answer tokens of the whole optimizer
step (so gradient accumulation and several processes weigh every token the
same), backward, clip, step. Checkpoints are written atomically and a rerun of
the same command resumes from the last one; a non-finite loss or gradient stops
before the update is applied. The draft's forward runs under bf16 autocast where
that was measured to pay (decode/precision.py); the loss is computed in float32.

With on-policy data (method.on_policy_answers), every epoch from method.on_policy_from_epoch on starts with the
draft as it is then answering each training prompt that many times and the target labelling the answers
(distill/on_policy.py); the epoch trains on them beside the target's own answers. The current epoch's answers are
kept in the checkpoints.

One code path runs in one process, under DDP and under FSDP2 (`accelerate launch`, docs/distributed.md): the
processes split every step's sequences, and a checkpoint holds the full (unsharded) state, so a run resumes
under any number of processes and either kind of parallelism (train/fsdp.py, train/checkpoints.py).
"""

from __future__ import annotations

import json
import logging
import math
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from decode.allocator import freed_memory_reused, return_freed_memory
from decode.errors import ConfigError, TrainingDiverged
from decode.examples import Example
from decode.kinds.base import TrainingObjective
from decode.kinds.common.pruned_head import base_causal_lm
from decode.precision import choose_precision, cpu_bf16_speedup, too_small_to_time
from decode.sampling import SamplingParams, probs_from_logits
from distill.losses import LOSSES, coarse_grained, masked_sum
from distill.on_policy import OnPolicySampler
from distill.throughput import LabelRate
from train.attention import choose_attention, eager_speedup
from train.batching import epoch_order
from train.checkpoints import Checkpoints
from train.config import MethodConfig
from train.fsdp import fill_parameters, is_sharded, meta_copy, sharding_summary, use_fsdp_on_cpu
from train.packing import answer_groups, collate_packs, packed_length, packs_of

log = logging.getLogger(__name__)


def acceptance_chance(draft_logits: torch.Tensor, target_top_logprobs: torch.Tensor, target_top_ids: torch.Tensor,
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
    """The one training recipe: the loop, the loss, validation, on-policy data, checkpoints and the processes
    around them; the draft's kind supplies what differs (its TrainingObjective: what the draft computes from a
    batch, the collation, the bf16 probe, the FSDP unit rule and the draft to save)."""

    def __init__(self, settings: MethodConfig, seed: int, objective: TrainingObjective, vocab_size: int,
                 pad_token_id: int, train_examples: list[Example], validation_examples: list[Example],
                 checkpoint_dir: Path, accelerator, tracker, eval_sampling: SamplingParams,
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
        self.checkpoints = Checkpoints(checkpoint_dir, accelerator, settings.keep_checkpoints)
        self.objective = objective
        self.step_acceptance: list[float] = []  # per draft step, at the last validation
        self.eval_sampling = eval_sampling
        self.loss_fn = LOSSES[settings.loss]
        use_fsdp_on_cpu(accelerator)
        self.sharded = is_sharded(accelerator)
        self._check_distribution(settings)
        log.info("training process %d of %d (%s)", accelerator.process_index, accelerator.num_processes,
                 accelerator.distributed_type.value)
        device = accelerator.device
        draft = objective.module
        self.resumed = self.checkpoints.resumable()
        autocast = settings.autocast
        # a resumed run keeps the precision it started in, so that it ends as a run never stopped would
        if self.resumed:
            autocast = self.resumed.trainer_state.get("autocast", autocast)
        self.precision = choose_precision(autocast, device.type, lambda: self._bf16_speedup(draft), "train")
        attention = (self.resumed.trainer_state.get("attention") if self.resumed else None) or settings.attention
        self.attention = choose_attention(attention, base_causal_lm(draft), device.type,
                                          lambda: self._eager_speedup(draft))
        # each training example's group: the answers of one prompt packed behind one reading of it (train/packing.py)
        self.groups = None
        if settings.pack_answers > 1 and objective.packs_answers and self.attention.implementation in ("sdpa", "eager"):
            self.groups = answer_groups(train_examples, settings.pack_answers)
            self.group_lengths = packed_length(train_examples, self.groups)
            log.info("%s", self._packing_line())
        trainable = [p for p in draft.parameters() if p.requires_grad]
        # fused: one pass over each tensor where the default takes several (on a CPU the 2-layer draft's update, its
        # 28M-element embedding included, went from 96 to 18 ms); FSDP's sharded parameters keep the default
        optimizer = torch.optim.AdamW(trainable, lr=settings.lr, weight_decay=settings.weight_decay,
                                      fused=not self.sharded and device.type in ("cpu", "cuda"))
        self.examples_per_step = settings.micro_batch_size * settings.gradient_accumulation * \
            accelerator.num_processes
        self.on_policy = on_policy if settings.on_policy_answers else None
        self.on_policy_pool: list[Example] = []
        self.on_policy_refresh = -1  # the epoch the pool was sampled for
        self.on_policy_rates: list[LabelRate] = []  # of the refreshes this process ran
        self.on_policy_samples_per_refresh: list[int] = []
        self.total_steps = settings.max_steps or self._steps_of_epochs(settings.epochs)
        self._order_of_epoch: tuple[int, list[int]] = (-1, [])
        # sharded, the trained weights are gathered into an unsharded copy of the draft to be saved
        self.unsharded = meta_copy(draft) if self.sharded else None
        if self.sharded:
            plugin = accelerator.state.fsdp_plugin
            # every process built the same draft: each keeps its own shard of it, no broadcast from the first
            # (accelerate's broadcast also fails on persistent buffers, as an EAGLE-3 head's vocabulary map)
            plugin.cpu_ram_efficient_loading = False
            if not objective.fsdp_units_below_root:
                plugin.auto_wrap_policy = None
        self.draft, self.optimizer = accelerator.prepare(draft, optimizer)
        if self.sharded:
            log.info("FSDP process %d: %s", accelerator.process_index, sharding_summary(self.draft))
        # not prepared: accelerate would step it once per process; the checkpoints hold it
        self.scheduler = get_cosine_schedule_with_warmup(self.optimizer, min(settings.warmup_steps, self.total_steps),
                                                         self.total_steps)
        self.step = 0
        # validation_acceptance_start/end and final_loss so far: kept in the checkpoints, so that a resumed run
        # reports what a run never stopped would
        self.history: dict = {}

    def _check_distribution(self, settings: MethodConfig) -> None:
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type == DistributedType.DEEPSPEED:
            raise ConfigError("DeepSpeed is not supported by the training recipe: use FSDP (accelerate launch "
                              "--config_file conf/accelerate/fsdp.yaml, docs/distributed.md)")
        if self.sharded and settings.on_policy_answers:
            raise ConfigError("method.on_policy_answers is not supported under FSDP: each process samples its own "
                              "prompts with the draft, a different number of forwards each, which sharded weights "
                              "cannot serve; use DDP or one process")

    # ---- the loop -------------------------------------------------------------------------------
    def train(self) -> dict:
        self._resume()
        history, postfix = self.history, {}
        bar = tqdm(total=self.total_steps, initial=self.step, desc="train", unit="step",
                   disable=not self.accelerator.is_main_process)
        if self.step == 0 and self.validation_examples:
            history["validation_acceptance_start"] = self.validation_acceptance()
            self.tracker.log({"validation/expected_acceptance": history["validation_acceptance_start"]}, step=0)
        stepped, step_seconds = 0, 0.0  # the optimizer steps this call ran and their time (no validation, no saving)
        # each step makes and frees tensors of 100+ MB: kept for the next step's (decode/allocator.py)
        with bar, freed_memory_reused():
            while self.step < self.total_steps:
                began = time.perf_counter()
                loss = history["final_loss"] = self._optimizer_step(self._micro_batches(self.step))
                step_seconds += time.perf_counter() - began
                stepped += 1
                history["seconds_per_step"] = round(step_seconds / stepped, 3)  # checkpointed: a rerun reports it
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
                    return_freed_memory()  # what the validation's batches freed, and blocks no step reused since
                bar.set_postfix(postfix)
                if self.step % self.settings.checkpoint_every == 0 or self.step == self.total_steps:
                    self._save_checkpoint()  # the final one too: a rerun of a finished run trains no more
        history.setdefault("final_loss", float("nan"))
        history.update(steps=self.total_steps, **self._packing_summary(), **self.precision.summary(),
                       **self.attention.summary())
        if self.objective.draft_steps > 1 and self.step_acceptance:
            history["validation_acceptance_steps"] = self.step_acceptance
        if self.on_policy:
            history.update(on_policy_samples=sum(self.on_policy_samples_per_refresh),
                           on_policy_seconds=round(sum(rate.seconds for rate in self.on_policy_rates), 1),
                           on_policy_labels=[rate.summary() for rate in self.on_policy_rates])
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
                # a packed position counts as many times as the unpacked sequences score it (loss_mask)
                loss = masked_sum(self.per_token_loss(batch), batch["loss_mask"]) * scale
                accelerator.backward(loss)
            step_loss += loss.detach()
        step_loss = accelerator.reduce(step_loss, reduction="sum").item() / accelerator.num_processes
        if not math.isfinite(step_loss):
            raise TrainingDiverged(
                f"the loss became {step_loss} at step {self.step + 1}; nothing of that step was applied. "
                f"Last good checkpoint: {self.checkpoints.latest() or 'none yet'}. "
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
                f"nothing of that step was applied. Last good checkpoint: {self.checkpoints.latest() or 'none yet'}. "
                f"Lower method.lr (now {self.settings.lr}) or check the training data.")
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return step_loss

    def per_token_loss(self, batch: dict) -> torch.Tensor:
        """[B, T] loss of each position against the recorded target distribution (masked by the caller): at index
        Q, the weighted sum over the objective's draft steps of each step's loss for the token after Q."""
        per_position = torch.zeros(batch["input_ids"].shape, device=self.accelerator.device)
        for step in self.objective.training_steps(self.draft, batch, self.precision.autocast):
            target_ids, cells = batch["target_ids"][:, step.shift:], None
            if step.columns is not None:  # target tokens outside the draft's columns join the bucket
                target_ids = step.columns[target_ids]
                cells = target_ids >= 0
                target_ids = target_ids.clamp(min=0)
            target_log_probs, draft_log_probs = coarse_grained(batch["target_logprobs"][:, step.shift:], target_ids,
                                                               step.logits, cells)
            loss = self.loss_fn(target_log_probs, draft_log_probs, **self.settings.loss_kwargs)
            if step.scored is not None:
                loss = torch.where(step.scored, loss, torch.zeros_like(loss))
            per_position = per_position + step.weight * F.pad(loss, (step.shift, 0))
        return per_position

    def _bf16_speedup(self, draft) -> float | None:
        """A few forward+backward steps of the draft on a random batch of a micro-batch's shape, float32 vs bf16
        autocast; the mean over the processes, so that all of them choose alike."""
        device = self.accelerator.device
        probe_batch = self._probe_batch()
        step, hidden_size = self.objective.bf16_probe(draft, probe_batch, device)
        speedup = cpu_bf16_speedup(step, math.prod(probe_batch), hidden_size)
        draft.zero_grad(set_to_none=True)
        if speedup is None:  # the same on every process: the model's size decides it
            return None
        return self.accelerator.reduce(torch.tensor(speedup, device=device), reduction="mean").item()

    def _eager_speedup(self, draft) -> float | None:
        """sdpa's time / eager's time of a forward + backward of the bf16 probe's batch in the training's precision;
        the mean over the processes, so that all of them choose alike."""
        device = self.accelerator.device
        probe_batch = self._probe_batch()
        step, hidden_size = self.objective.bf16_probe(draft, probe_batch, device)
        if too_small_to_time(math.prod(probe_batch), hidden_size):
            return None

        def step_in_precision():
            with self.precision.autocast():
                step()
        speedup = eager_speedup(base_causal_lm(draft), step_in_precision)
        draft.zero_grad(set_to_none=True)
        return self.accelerator.reduce(torch.tensor(speedup, device=device), reduction="mean").item()

    def _probe_batch(self) -> tuple[int, int]:
        """sequences x tokens that `auto` times: one micro-batch of the training sequences' median length. A
        smaller probe understates bf16, whose gain grows with the rows of each matmul while the step's fixed work
        does not shrink: on a Zen 4 core the derived draft's step ran 1.09x faster under bf16 at [2 x 64], and
        1.46-1.74x at the [8 x 128] it trains on."""
        lengths = sorted(len(example.input_ids) for example in self.train_examples)
        return self.settings.micro_batch_size, lengths[len(lengths) // 2]

    # ---- data order: a function of the step, so a resumed run sees the same batches ----------------
    def _micro_batches(self, step: int) -> list[dict]:
        epoch = self._epoch_of(step)
        examples = self.train_examples + self._on_policy_examples(epoch)
        order = self._epoch_order(epoch, examples)
        begin = (step - self._epoch_start(epoch)) * self.examples_per_step
        chosen = [order[(begin + i) % len(order)] for i in range(self.examples_per_step)]
        processes, process = self.accelerator.num_processes, self.accelerator.process_index
        # each process a run of the step's examples, so that a prompt's answers stay together to be packed
        mine = chosen[len(chosen) * process // processes: len(chosen) * (process + 1) // processes]
        size = self.settings.micro_batch_size
        return [self._to_device(self._collate([examples[index] for index in mine[at: at + size]], mine[at: at + size]))
                for at in range(0, len(mine), size)]

    def _epoch_steps(self, epoch: int) -> int:
        """An epoch shows every target answer once, and the epoch's on-policy answers once."""
        examples = len(self.train_examples) + (self.on_policy.answers_per_refresh if self._samples(epoch) else 0)
        return math.ceil(examples / self.examples_per_step)

    def _epoch_start(self, epoch: int) -> int:
        return sum(self._epoch_steps(e) for e in range(epoch))

    def _steps_of_epochs(self, epochs: float) -> int:
        """The steps of `epochs` epochs; a fraction of an epoch is that share of its steps."""
        whole = math.floor(epochs)
        return self._epoch_start(whole) + math.ceil((epochs - whole) * self._epoch_steps(whole))

    def _epoch_of(self, step: int) -> int:
        epoch, start = 0, 0
        while start + self._epoch_steps(epoch) <= step:
            start += self._epoch_steps(epoch)
            epoch += 1
        return epoch

    def _epoch_order(self, epoch: int, examples: list[Example]) -> list[int]:
        if self._order_of_epoch[0] != epoch:
            lengths = [len(example.input_ids) for example in examples]
            groups = group_lengths = None
            if self.groups is not None:
                groups = [self._group_of(index) for index in range(len(examples))]
                group_lengths = {**self.group_lengths, **{group: lengths[index] for index, group
                                                          in enumerate(groups) if group < 0}}
            self._order_of_epoch = (epoch, epoch_order(lengths, self.examples_per_step, self.seed * 1000 + epoch,
                                                       self.settings.group_by_length, groups, group_lengths))
        return self._order_of_epoch[1]

    def _collate(self, examples: list[Example], indices: list[int] | None = None) -> dict:
        """A batch of examples; in training (indices: theirs in the epoch's examples), each run of one group's as one
        packed row."""
        if self.groups is None or indices is None:
            return self.objective.collate(examples, self.pad_token_id)
        return collate_packs(packs_of(examples, [self._group_of(index) for index in indices]), self.pad_token_id,
                             boolean_mask=self.attention.implementation == "sdpa")

    def _group_of(self, index: int) -> int:
        """The packing group of the epoch's example `index`: an on-policy answer (after the training examples) is a
        group of its own, numbered below every other."""
        return self.groups[index] if index < len(self.groups) else -1 - index

    def _packing_summary(self) -> dict:
        if self.groups is None:
            return {"packed": False}
        return {"packed": True, "epoch_tokens": sum(self.group_lengths.values()),
                "unpacked_epoch_tokens": sum(len(example.input_ids) for example in self.train_examples)}

    def _packing_line(self) -> str:
        packing = self._packing_summary()
        packed, unpacked = packing["epoch_tokens"], packing["unpacked_epoch_tokens"]
        return (f"{len(self.train_examples)} training sequences in {len(self.group_lengths)} packed rows "
                f"(method.pack_answers {self.settings.pack_answers}): {packed:,} tokens an epoch against "
                f"{unpacked:,} unpacked ({1 - packed / unpacked:.0%} fewer)")

    # ---- on-policy sequences: the draft's answers as it is at the start of each epoch from on_policy_from_epoch --
    def _samples(self, epoch: int) -> bool:
        return bool(self.on_policy) and epoch >= self.settings.on_policy_from_epoch

    def _on_policy_examples(self, epoch: int) -> list[Example]:
        if not self._samples(epoch):
            return []
        if epoch != self.on_policy_refresh:
            self._refresh_on_policy(epoch)
        return self.on_policy_pool

    def _refresh_on_policy(self, epoch: int) -> None:
        """The draft as it is now answers every training prompt answers_per_prompt times; each process samples its
        share."""
        accelerator = self.accelerator
        chosen = self.on_policy.prompts_for(epoch)
        with self.objective.decoding_draft(self.accelerator.unwrap_model(self.draft)) as draft:
            pool, rate = self.on_policy.sample(draft, chosen[accelerator.process_index:: accelerator.num_processes],
                                               epoch)
        if accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            pool = gather_object(pool)
        if len(pool) != self.on_policy.answers_per_refresh:
            raise ValueError(f"{self.on_policy.answers_per_refresh - len(pool)} on-policy answers do not fit "
                             f"method.max_length; raise it")
        self.on_policy_pool, self.on_policy_refresh = pool, epoch
        self.on_policy_rates.append(rate)
        self.on_policy_samples_per_refresh.append(len(pool))
        log.info("epoch %d, %s", epoch, rate.line())
        self.tracker.log({"train/on_policy_seconds": sum(r.seconds for r in self.on_policy_rates),
                          "train/on_policy_tokens_per_minute": rate.per_minute}, step=self.step)

    def _to_device(self, batch: dict) -> dict:
        return {key: value.to(self.accelerator.device) for key, value in batch.items()}

    # ---- validation acceptance: sum min(p, q) under the decoder's own sampling settings ---------------
    @torch.no_grad()
    def validation_acceptance(self) -> float:
        """Mean over validation answer tokens of sum_x min(p(x), q(x)) under the decoder's sampling settings:
        the chance the decoder accepts the draft's token there (p over the target's recorded top-k). A draft of
        several steps gives its first step's figure; every step's is logged and kept (step_acceptance)."""
        self.draft.eval()
        steps = self.objective.draft_steps
        accepted = torch.zeros(steps, dtype=torch.float64, device=self.accelerator.device)
        positions = torch.zeros_like(accepted)
        size = self.settings.micro_batch_size
        for at in range(0, len(self.validation_examples), size):
            batch = self._to_device(self._collate(self.validation_examples[at: at + size]))
            for index, step in enumerate(self.objective.validation_steps(self.draft, batch, self.precision.autocast)):
                shifted = slice(step.shift, None)
                per_position = acceptance_chance(step.logits, batch["target_logprobs"][:, shifted],
                                                 batch["target_ids"][:, shifted], self.eval_sampling, step.columns)
                accepted[index] += masked_sum(per_position, batch["loss_mask"][:, shifted])
                positions[index] += batch["loss_mask"][:, shifted].sum()
        self.draft.train()
        totals = self.accelerator.reduce(torch.stack([accepted, positions]), reduction="sum")
        self.step_acceptance = [(a / n).item() if n else float("nan") for a, n in zip(*totals)]
        if steps > 1:
            self.tracker.log({f"validation/expected_acceptance_step_{step}": figure
                              for step, figure in enumerate(self.step_acceptance)}, step=self.step)
        return self.step_acceptance[0]

    def trained_draft(self):
        """The trained draft, unwrapped, as its kind saves it (a pruned draft with its full output head back in
        place). Sharded (FSDP), every process must call it: the weights are gathered into an unsharded copy on the
        main process's CPU; the other processes get that copy with its parameters on the meta device (shapes, no
        values)."""
        return self.objective.trained_draft(self._trained_model())

    def _trained_model(self) -> nn.Module:
        if not self.sharded:
            return self.accelerator.unwrap_model(self.draft)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.draft, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.accelerator.is_main_process:
            fill_parameters(self.unsharded, state)
            self.unsharded.to("cpu")
        return self.unsharded

    # ---- checkpoints: a rerun of the same command resumes from the last one --------------------------
    def _save_checkpoint(self) -> None:
        files = {}
        if self.on_policy_pool:  # a resumed run goes on with the samples this one was training on
            files["on_policy.json"] = json.dumps({"epoch": self.on_policy_refresh,
                                                  "examples": [e.as_json() for e in self.on_policy_pool]})
        trainer = {"step": self.step, "autocast": self.precision.name, "attention": self.attention.implementation,
                   "processes": self.accelerator.num_processes, "history": self.history,
                   "step_acceptance": self.step_acceptance}
        self.checkpoints.save(self.step, self.draft, self.optimizer, self.scheduler, trainer, files)

    def _resume(self) -> None:
        resumed, self.resumed = self.resumed, None  # its states are restored once, then freed
        if resumed is None:
            return
        trainer_state = self.checkpoints.load(resumed, self.draft, self.optimizer, self.scheduler)
        self.step = trainer_state["step"]
        self.history = trainer_state.get("history", {})
        self.step_acceptance = trainer_state.get("step_acceptance", [])
        if self.on_policy and (resumed.path / "on_policy.json").is_file():
            saved = json.loads((resumed.path / "on_policy.json").read_text())
            self.on_policy_pool = [Example(**example) for example in saved["examples"]]
            self.on_policy_refresh = saved["epoch"]
        log.info("resumed from %s (step %d of %d)", resumed.path, self.step, self.total_steps)
