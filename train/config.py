"""The whole `python -m train` configuration as dataclasses, registered as Hydra's schema.

conf/train.yaml starts from `train_schema`, so every group file and command-line override is checked
against these types when Hydra composes; `load()` turns the result into the dataclasses once.
"""

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from decode.config import DecodeConfig, ExportConfig, PairConfig
from decode.kinds.registry import kind_for, kind_settings
from decode.tracking import LoggerConfig
from distill.config import DomainConfig, GenerateConfig
from eval.config import EvalConfig

STAGES = ("generate", "train", "eval", "export")


@dataclass
class LoraSettings:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    # every projection of attention and MLP: the draft is small, and adapters on all of them learn most
    target_modules: List[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                               "up_proj", "down_proj"])


@dataclass
class MethodConfig:
    """How the draft learns: the loss, the optimizer and its schedule, pruning, LoRA. What only one kind of draft
    trains with is its kind's: pair.draft.settings."""

    name: str = "distill"
    loss: str = "kl_tv_mix"  # forward_kl | reverse_kl | jsd | tv | neg_log_acceptance | kl_tv_mix
    loss_kwargs: Dict[str, Any] = field(default_factory=dict)
    lr: float = 2.0e-3
    weight_decay: float = 0.0
    warmup_steps: int = 10
    # 800 steps on the 1,600 default answers (400 prompts, 4 answers each; +domain=code: 3); a fraction (2.5) trains
    # that share of the last epoch's steps
    epochs: float = 4
    max_steps: Optional[int] = None  # overrides epochs
    micro_batch_size: int = 8
    gradient_accumulation: int = 1
    # each step's sequences of similar length, so that less of a batch is padding (the steps still come in a
    # random order): train/batching.py
    group_by_length: bool = True
    max_length: int = 320  # tokens per training sequence (prompt + answer)
    # up to this many answers of one prompt trained in one row behind one reading of the prompt, each position's
    # logits and loss those of the unpacked sequences (train/packing.py; 1: every answer in a row of its own). The
    # draft's kind must read packed rows (a draft model does; an EAGLE-3, DFlash or parallel head does not). On the
    # code domain 2 read 20% fewer tokens (a step 1.12-1.16x faster) and held out 0.575 against 0.577 unpacked, at
    # about 0.007 less validation; 4 read 29% fewer but held out 0.547: a step then sees the answers of 2 prompts
    # instead of 4 to 8 (BENCHMARKS.md)
    pack_answers: int = 2
    max_grad_norm: float = 1.0
    train_embeddings: bool = True
    prune_vocab: int = 8192  # keep the K tokens with the most target probability in the training data (0: all)
    # on-policy data (distill/on_policy.py): from epoch on_policy_from_epoch (0-based) on, each epoch starts with the
    # draft as it is then answering every training prompt on_policy_answers times, the target labelling the answers
    # in one teacher-forced forward a batch; the epoch trains on them beside the target's answers (0: off)
    on_policy_answers: int = 0
    on_policy_from_epoch: int = 1
    # random sequences of 16 to 80 tokens read twice, labelled by the target over the second reading and trained on
    # beside its answers: a derived draft learns to copy its context from them (distill/repeats.py; 0: none; None:
    # 400 for a draft model, which adds a quarter to the default's steps, none for a head over the target's states,
    # which then also reads the target's states over them).
    # With them the default draft repeats such a sequence 0.77 of the time (0.00 without) and accepts more of the
    # validation answers (BENCHMARKS.md)
    repeat_rows: Optional[int] = None
    # up to this many tokens of the training sequences between a random sequence's two readings (each row's gap
    # uniform from 0): copies reach back that far in long prompts (0: the second reading right after the first)
    repeat_gap: int = 0
    # a checkpoint of the default draft and its optimizer is 0.5 GB (about 1.7 s to write on a CPU VM) and a
    # validation pass about 2.5 s: every 24 steps they took a quarter of the train stage
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    eval_every: int = 100  # steps between validation passes (and the last step)
    autocast: str = "auto"  # auto | bf16 | off: bf16 autocast of the draft's forward; auto measures it on a CPU
    # auto | sdpa | eager: transformers' attention in the draft's training forwards; auto times a training step
    # with each on a CPU (train/attention.py). A draft of its own kind (an EAGLE-3 or DFlash head) runs its own
    attention: str = "auto"
    lora: Optional[LoraSettings] = None


@dataclass
class TrainConfig:
    pair: PairConfig = field(default_factory=PairConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    domain: Optional[DomainConfig] = None  # appended on the command line: +domain=code
    stages: List[str] = field(default_factory=lambda: list(STAGES))
    seed: int = 0
    run_dir: Optional[str] = None
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    export: ExportConfig = field(default_factory=ExportConfig)


def register() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def load(cfg: DictConfig) -> TrainConfig:
    """The composed configuration as dataclasses, interpolations resolved, the draft's kind settings whole and checked
    (its defaults filled in: what config.yaml records and the run directory's name hashes)."""
    config = OmegaConf.to_object(cfg)
    draft = config.pair.draft
    draft.settings = asdict(kind_settings(kind_for(draft), draft.settings))
    return config


def as_dict(config) -> dict:
    """A dataclass configuration as plain data (for config.yaml, W&B and the model card)."""
    return OmegaConf.to_container(OmegaConf.structured(config), resolve=True)
