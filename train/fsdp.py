"""FSDP2 on CPU processes, and the unsharded copy a sharded draft's gathered weights go back into."""

from __future__ import annotations

import copy
import logging
import os

import torch
from torch import nn

from decode.errors import ConfigError

log = logging.getLogger(__name__)


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
