"""The figures one room hands another: acceptance, step costs, the engine check, what the monitor reads of an export.

Each is a dataclass with one writer (`to_json`) and one reader (`from_json`), and the JSON keeps the keys these
figures have always had on disk (stage results, summary.json, export.json), so that earlier records still load.
Gamma-keyed maps are int-keyed here and str-keyed in JSON, as JSON objects need.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Optional

from decode.llama_cpp_lookup import LookupSetting


def format_figure(value, spec: str = ".3f") -> str:
    """A figure as the summary and the model card print it; "-" where there is none."""
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def format_interval(bounds, spec: str = ".3f") -> str:
    """ [low, high] after a figure; nothing where there is no interval."""
    return f" [{bounds[0]:{spec}}, {bounds[1]:{spec}}]" if bounds else ""


def _known(cls, data: dict) -> dict:
    """The entries of `data` that are fields of `cls` (a record written by another version may have more)."""
    names = {f.name for f in fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def _by_gamma(values: Optional[dict]) -> Optional[dict]:
    return None if values is None else {int(gamma): value for gamma, value in values.items()}


def _by_gamma_json(values: dict) -> dict:
    return {str(gamma): values[gamma] for gamma in sorted(values)}


@dataclass
class EngineCommands:
    """How the engines serve an exported draft, each None where that engine does not: vLLM's --speculative-config
    value and its `vllm serve` command, SGLang's and llama.cpp's launch commands (decode/export/engines.py)."""

    vllm_speculative_config: Optional[dict] = None
    vllm: Optional[list[str]] = None
    sglang: Optional[list[str]] = None
    llama_cpp: Optional[list[str]] = None

    def to_json(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}

    @classmethod
    def from_json(cls, data: dict) -> "EngineCommands":
        return cls(**_known(cls, data))

    @property
    def engines(self) -> list[str]:
        """The engines that serve the draft, by the names of their commands."""
        return [name for name in ("vllm", "sglang", "llama_cpp") if getattr(self, name) is not None]

    @property
    def vllm_target(self) -> str:
        """The model `vllm serve MODEL ...` serves."""
        return self.vllm[self.vllm.index("serve") + 1]

    @property
    def llama_cpp_spec_type(self) -> str:
        """The --spec-type llama-server drafts with."""
        return self.llama_cpp[self.llama_cpp.index("--spec-type") + 1]


@dataclass(kw_only=True)
class RuleFigures:
    """One drafting rule's expected acceptance (decode/acceptance_rules.py) at the positions the eval tested: per
    token and per draft position, each with its 95% interval over prompts."""

    token_acceptance: Optional[float] = None
    token_acceptance_interval: Optional[list[float]] = None
    by_position: list[Optional[float]] = field(default_factory=list)
    by_position_intervals: list[Optional[list[float]]] = field(default_factory=list)


@dataclass(kw_only=True)
class AcceptanceFigures:
    """One draft on a set of prompts at one gamma (eval/acceptance.py figures): summed counts, the rates with their
    95% intervals, the speed against AR, the prediction from the step costs, and `flags`: what makes the speedup
    untrustworthy. A rate with nothing to divide by is None."""

    prompts: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0  # rounds whose acceptance test failed
    copied: int = 0  # drafted tokens that were context copies
    gamma: int
    alpha: Optional[float] = None  # accepted / drafted
    alpha_interval: Optional[list[float]] = None
    token_acceptance: Optional[float] = None  # accepted / tested
    token_acceptance_interval: Optional[list[float]] = None
    mean_accepted_length: Optional[float] = None
    alpha_by_position: list[Optional[float]] = field(default_factory=list)  # accepted / drafted there
    token_acceptance_by_position: list[Optional[float]] = field(default_factory=list)  # accepted / tested there
    tokens_per_s: Optional[float] = None
    ar_tokens_per_s: Optional[float] = None
    speedup: Optional[float] = None
    speedup_interval: Optional[list[float]] = None
    c: Optional[float] = None  # a draft step / an AR step
    v: Optional[float] = None  # a verify at `gamma` / an AR step
    predicted_speedup: Optional[float] = None
    recommended_gamma: Optional[int] = None
    flags: list[str] = field(default_factory=list)
    counts: dict = field(default_factory=dict)  # decode.metrics.DecodeMetrics, summed, as plain data
    ar_counts: Optional[dict] = None
    rules: dict[str, RuleFigures] = field(default_factory=dict)  # per drafting rule

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> AcceptanceFigures:
        known = _known(cls, data)
        if "acceptance_by_position" in data:  # its name before the per-token rates by position were kept too
            known.setdefault("alpha_by_position", data["acceptance_by_position"])
        if "token_acceptance_by_position" not in data:
            counts = data.get("counts") or {}
            known["token_acceptance_by_position"] = [
                accepted / tested if tested else None
                for accepted, tested in zip(counts.get("accepted_per_position", []),
                                            counts.get("tested_per_position", []))]
        rules = {rule: RuleFigures(**figures) for rule, figures in known.pop("rules", {}).items()}
        return cls(**known, rules=rules)


@dataclass(kw_only=True)
class EngineFigures:
    """What one engine can expect from the draft under its own drafting rule (decode/engine_rules.py): the rule's
    per-token acceptance, the gamma (and for llama.cpp the --spec-draft-p-min) with the most predicted tokens per
    second, and that predicted speedup over the target alone, from the step costs named in `step_costs`."""

    engine: str
    rule: str
    token_acceptance: Optional[float] = None
    token_acceptance_interval: Optional[list[float]] = None
    step_costs: str = "decoder"  # whose step costs: decoder (this project's, timed in the eval) | llama.cpp
    gamma: Optional[int] = None
    p_min: Optional[float] = None
    predicted_speedup: Optional[float] = None

    @property
    def worth_serving(self) -> Optional[bool]:
        return None if self.predicted_speedup is None else self.predicted_speedup >= 1.0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> EngineFigures:
        return cls(**_known(cls, data))


@dataclass
class MixedFigures:
    """llama-server with an n-gram lookup before the draft (`--spec-type <lookup>,<the draft's type>`), its rounds
    replayed over the held-out answers (decode/llama_cpp_mixed.py), beside the draft alone on the same answers.

    The rounds are priced in the step costs named in `step_costs` (decode/llama_cpp_round_costs.py: c, the v(k)
    measured and v's slope past them): predicted AR steps per generated token, and `speed_ratio`, the draft
    alone's over the mixed rule's, paired by prompt. Tokens per target forward count the forwards whatever they
    verified; `gain` is their ratio. The lookup and its sizes are the ones with the fewest predicted steps per
    token on the validation answers (`validation_*`), or llama.cpp's defaults where there were none
    (`defaults_because` says why). Without step costs (step_costs None) the forwards alone choose and decide."""

    spec_type: str
    size_n: int  # --spec-<lookup>-size-n
    size_m: int  # --spec-<lookup>-size-m
    gamma: int  # --spec-draft-n-max
    p_min: float  # --spec-draft-p-min
    prompts: int
    draft_n: int  # timings.draft_n over the prompts
    draft_n_accepted: int  # timings.draft_n_accepted
    lookup_rounds: int
    rounds: int  # with a draft, the lookup's or the model's
    alpha: Optional[float] = None  # draft_n_accepted / draft_n
    alpha_interval: Optional[list[float]] = None
    tokens_per_forward: Optional[float] = None
    alone_tokens_per_forward: Optional[float] = None
    gain: Optional[float] = None
    gain_interval: Optional[list[float]] = None
    step_costs: Optional[str] = None  # whose priced the rounds: decoder (timed in the eval) | llama.cpp
    draft_cost: Optional[float] = None  # c
    verify_costs: Optional[dict[int, float]] = None  # v(k) for each k measured
    verify_slope: Optional[float] = None  # v's growth a drafted token past the largest k measured
    steps_per_token: Optional[float] = None  # predicted AR steps per generated token after the prefill
    alone_steps_per_token: Optional[float] = None
    speed_ratio: Optional[float] = None  # alone_steps_per_token / steps_per_token
    speed_ratio_interval: Optional[list[float]] = None
    validation_prompts: int = 0  # the answers the setting was chosen on
    settings_tried: int = 0
    validation_tokens_per_forward: Optional[float] = None  # the chosen setting's there
    validation_alone_tokens_per_forward: Optional[float] = None
    validation_steps_per_token: Optional[float] = None
    validation_alone_steps_per_token: Optional[float] = None
    defaults_because: Optional[str] = None

    @property
    def lookup(self) -> LookupSetting:
        return LookupSetting(self.spec_type.split(",")[0], self.size_n, self.size_m)

    @property
    def pays(self) -> bool:
        """Whether the lookup first is faster on the held-out answers beyond doubt: the speed ratio's 95% interval
        lies above 1; without step costs, the forward gain's."""
        interval = self.gain_interval if self.step_costs is None else self.speed_ratio_interval
        return interval is not None and interval[0] > 1.0

    def to_json(self) -> dict:
        data = asdict(self)
        if self.verify_costs is not None:
            data["verify_costs"] = _by_gamma_json(self.verify_costs)
        return data

    @classmethod
    def from_json(cls, data: dict) -> MixedFigures:
        known = _known(cls, data)
        return cls(**{**known, "verify_costs": _by_gamma(known.get("verify_costs"))})


@dataclass(kw_only=True)
class StepCostFigures:
    """decode/step_costs.py's measurement as ratios to one AR step: c, and v(gamma) for each gamma timed."""

    context: int  # cached tokens before the timed forwards
    target_step_ms: float
    draft_step_ms: float
    c: float
    v: dict[int, float]
    repeats: int = 0  # timed repetitions behind the figures
    # when measured: the interquartile ranges of the AR step's milliseconds, of c's ratios, of each v(gamma)'s
    target_step_ms_spread: Optional[list[float]] = None
    c_spread: Optional[list[float]] = None
    v_spread: Optional[dict[int, list[float]]] = None
    parallel: bool = False  # c is the forward of a whole round (a parallel draft)
    int8_draft: bool = False  # the draft decoded on int8 weights (decode/int8_draft.py)

    def to_json(self) -> dict:
        data = {"context": self.context, "target_step_ms": self.target_step_ms, "draft_step_ms": self.draft_step_ms,
                "c": self.c, "v": _by_gamma_json(self.v)}
        if self.parallel:
            data["parallel"] = True
        if self.int8_draft:
            data["int8_draft"] = True
        if self.c_spread is not None:
            data.update(repeats=self.repeats, target_step_ms_spread=self.target_step_ms_spread,
                        c_spread=self.c_spread, v_spread=_by_gamma_json(self.v_spread))
        return data

    @classmethod
    def from_json(cls, data: dict) -> StepCostFigures:
        known = _known(cls, data)
        return cls(**{**known, "v": _by_gamma(known["v"]), "v_spread": _by_gamma(known.get("v_spread"))})


@dataclass(kw_only=True)
class EngineCheck:
    """The exported GGUF served by llama-server at export: skipped (and why), or what it drafted and the target
    accepted; served with an n-gram lookup first (`lookup_arguments`), also what the replay of its answers
    predicted it would count (decode/llama_cpp_mixed.py served_counts); for a draft llama-bench can time, also the
    engine's step costs, the gamma they recommend for the draft's per-token acceptance and the speedup they predict
    there."""

    skipped: Optional[str] = None
    prompts: Optional[int] = None
    drafted: Optional[int] = None
    accepted: Optional[int] = None
    alpha: Optional[float] = None
    lookup_arguments: Optional[list[str]] = None  # the --spec-type list served and its sizes; None: the draft alone
    predicted_drafted: Optional[int] = None
    predicted_accepted: Optional[int] = None
    predicted_lookup_rounds: Optional[int] = None
    predicted_rounds: Optional[int] = None
    target_tokens_per_s: Optional[float] = None
    draft_tokens_per_s: Optional[float] = None
    c: Optional[float] = None
    v: Optional[dict[int, float]] = None
    gamma: Optional[int] = None
    p_min: Optional[float] = None  # --spec-draft-p-min with the most predicted tokens per second
    token_acceptance: Optional[float] = None  # llama.cpp's drafting rule's (greedy), from the eval
    predicted_speedup: Optional[float] = None

    @property
    def has_step_costs(self) -> bool:
        return self.c is not None

    def to_json(self) -> dict:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        data = {"prompts": self.prompts, "drafted": self.drafted, "accepted": self.accepted, "alpha": self.alpha}
        if self.lookup_arguments is not None:
            data.update(lookup_arguments=self.lookup_arguments, predicted_drafted=self.predicted_drafted,
                        predicted_accepted=self.predicted_accepted,
                        predicted_lookup_rounds=self.predicted_lookup_rounds, predicted_rounds=self.predicted_rounds)
        if self.has_step_costs:
            data.update(target_tokens_per_s=self.target_tokens_per_s, draft_tokens_per_s=self.draft_tokens_per_s,
                        c=self.c, v=_by_gamma_json(self.v), gamma=self.gamma, p_min=self.p_min,
                        token_acceptance=self.token_acceptance, predicted_speedup=self.predicted_speedup)
        return data

    @classmethod
    def from_json(cls, data: dict) -> EngineCheck:
        known = _known(cls, data)
        return cls(**{**known, "v": _by_gamma(known.get("v"))})


@dataclass(kw_only=True)
class VllmCheck:
    """The export served by vLLM (decode/export/vllm_engine_check.py): skipped (and why), or, on the same prompts,
    greedy, the target alone and the target with the draft: vLLM's own counters, whether the draft changed a token,
    and each server's tokens per second (wall time per request, one at a time)."""

    skipped: Optional[str] = None
    method: Optional[str] = None
    gamma: Optional[int] = None
    dtype: Optional[str] = None
    prompts: Optional[int] = None
    rounds: Optional[int] = None
    drafted: Optional[int] = None
    accepted: Optional[int] = None
    accepted_per_position: Optional[list[int]] = None
    alpha: Optional[float] = None
    token_acceptance: Optional[float] = None  # accepted / (accepted + rounds that rejected a drafted token)
    decoder_token_acceptance: Optional[float] = None  # this project's decoder: the same prompts, draft and gamma
    same_tokens_as_target_alone: Optional[bool] = None
    target_tokens_per_s: Optional[float] = None
    draft_tokens_per_s: Optional[float] = None  # the target with the draft
    speedup: Optional[float] = None

    def to_json(self) -> dict:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "skipped"}

    @classmethod
    def from_json(cls, data: dict) -> VllmCheck:
        return cls(**_known(cls, data))


@dataclass(kw_only=True)
class ServingStepCosts:
    """The step costs of the engine an export is most likely served by (export.json's `step_costs`): what the
    monitor's break-even threshold is computed from."""

    engine: str  # llama.cpp (llama-bench's) | decoder (this project's decoder, timed in the eval)
    gamma: int  # the gamma the engines are told
    c: float
    v: dict[int, float]

    def to_json(self) -> dict:
        return {"engine": self.engine, "gamma": self.gamma, "c": self.c, "v": _by_gamma_json(self.v)}

    @classmethod
    def from_json(cls, data: dict) -> ServingStepCosts:
        return cls(engine=data["engine"], gamma=int(data["gamma"]), c=float(data["c"]),
                   v={int(gamma): float(cost) for gamma, cost in data["v"].items()})
