"""The export stage: the trained draft as a serving directory, checked by reading it back before it lands.

Each draft kind writes its own files (DraftKind.export, decode/kinds/), e.g. for a draft model of its own
(pair.draft.kind=causal_lm; decode/kinds/common/model_draft_export.py):

    <export>/draft/          HF safetensors + config + the target's tokenizer (vLLM, SGLang)
    <export>/draft.gguf      the same weights for llama.cpp (-md)

and for an EAGLE-3 head (pair.draft.kind=eagle3; decode/kinds/eagle3/export.py):

    <export>/draft/          the speculators format (vLLM) + the target's tokenizer
    <export>/sglang/         the SpecForge format (SGLang)
    <export>/draft.gguf      llama.cpp's EAGLE-3 GGUF (-md, --spec-type draft-eagle3)

Every kind:

    <export>/serving/        the engines' flags and scripts: vllm.json (--speculative-config), vllm.sh, sglang.sh,
                             llama_cpp.sh (for the engines that serve the kind)
    <export>/README.md       model card: target, domain, data, method, alpha, gamma, provenance
    <export>/export.json     paths, flags, the round-trip checks and the engine check (llama-server, when installed)

The export is built in a staging directory and renamed into place, so an existing
export is replaced whole or not at all, and never without export.overwrite. Only a directory holding an export
(its export.json) or nothing is ever replaced: never the run's or the user's directories, nor through a symbolic link.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from decode.config import DecodeConfig, ExportConfig
from decode.context import RunContext
from decode.errors import ExportError
from decode.export.card import model_card
from decode.export.engine_check import engine_warnings
from decode.export.vllm_engine_check import format_check, vllm_check
from decode.export.engines import ServingTarget, write_serving_files
from decode.export.job import ExportJob
from decode.export.export_record import RECORD_FILE, ExportRecord, holds_an_export
from decode.files import published
from decode.kinds.registry import kind_for
from decode.models import gguf_path, serving_path
from decode.pair import load_draft
from decode.figures import EngineCheck, ServingStepCosts, VllmCheck
from decode.stage_results import ENGINE_CHECK, RESULTS_DIR, VLLM_CHECK, DraftRecords, EvalResult, ExportResult
from decode.serving.vllm_server import VllmSpec, vllm_draft_settings

log = logging.getLogger(__name__)


def export_destination(run_dir: Path, settings: ExportConfig) -> Path:
    """Where the export goes: a new or empty directory, or one holding an earlier export (replaced whole, and only
    with export.overwrite). Refused whatever export.overwrite says: a symbolic link, a file, a directory holding
    anything else, and the directories the run or the user work in."""
    named = Path(settings.dir) if settings.dir else run_dir / "export"
    setting = f"export.dir={settings.dir}" if settings.dir else f"the export directory {named}"
    if named.is_symlink():
        raise ExportError(f"{setting} is a symbolic link (to {os.readlink(named)}), and an export replaces its "
                          f"directory whole; {CHOOSE_ANOTHER}")
    destination = named.resolve()
    protected = protected_directory(destination, run_dir.resolve())
    if protected:
        raise ExportError(f"{setting} is {protected}, which an export would replace whole; {CHOOSE_ANOTHER}")
    if destination.exists():
        if not destination.is_dir():
            raise ExportError(f"{setting} is a file, not a directory; {CHOOSE_ANOTHER}")
        if not holds_nothing(destination) and not holds_an_export(destination):
            raise ExportError(f"{setting}: {destination} holds files other than an export ({RECORD_FILE} of "
                              f"specdraft's), and an export replaces its directory whole, export.overwrite or not; "
                              f"{CHOOSE_ANOTHER}")
        if not settings.overwrite:
            raise ExportError(f"{destination} exists; set export.overwrite=true to replace it")
    return destination


CHOOSE_ANOTHER = "set export.dir to a new or empty directory, or to one holding an earlier export"
RUN_OWN = ("draft", "checkpoints", RESULTS_DIR)  # what the run writes in its directory beside the export


def protected_directory(destination: Path, run_dir: Path) -> str | None:
    """What `destination` is, when it is a directory no export may replace: the run's, the current or the home
    directory, one holding them, or one the run keeps its own files in."""
    for name, directory in (("the run directory", run_dir), ("the current directory", Path.cwd().resolve()),
                            ("your home directory", Path.home().resolve())):
        if destination == directory:
            return f"{name} ({directory})"
        if destination in directory.parents:
            return f"a directory holding {name} ({directory})"
    for name in RUN_OWN:
        own = run_dir / name
        if destination == own or own in destination.parents:
            return f"{'' if destination == own else 'inside '}the run's {name} directory ({own})"
    return None


def holds_nothing(directory: Path) -> bool:
    try:
        return not any(directory.iterdir())
    except OSError:  # unreadable: not known to be empty
        return False


def identity(path: Path) -> tuple[int, int] | None:
    """What tells `path` from another put in its place meanwhile (None: nothing there)."""
    try:
        found = path.lstat()
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def run_export(ctx: RunContext, settings: ExportConfig, decode: DecodeConfig, verify_prompt_ids: list[list[int]],
               verify_max_new_tokens: int, config: dict, draft: DraftRecords) -> ExportResult | None:
    """Writes the export of the run's trained draft; `config` (plain data) goes into the model card.

    `draft.evaluated` is the eval of this very draft (None when it has none: the export then serves at decode.gamma
    and its card says it was not evaluated); `draft.trained` and `draft.generated` describe how it was made.
    """
    evaluated = draft.evaluated
    draft_spec = ctx.trained_draft_spec()
    destination = export_destination(ctx.run_dir, settings)
    if not ctx.is_main_process:
        return None
    target_gguf = gguf_path(ctx.target_spec)
    job = ExportJob(ctx, settings, decode, draft_spec, destination,
                    ServingTarget(serving_path(ctx.target_spec), str(target_gguf) if target_gguf else None),
                    target_gguf, gamma=(evaluated.engine_gamma("vllm") if evaluated else None) or decode.gamma,
                    verify_ids=verify_prompt_ids[: settings.verify_prompts], max_new_tokens=verify_max_new_tokens,
                    engine_acceptance=evaluated.engine_acceptance if evaluated else None,
                    engines=evaluated.engines if evaluated else {},
                    llama_cpp_mixed=evaluated.llama_cpp_mixed if evaluated else None)
    kind = kind_for(draft_spec)
    found = identity(destination)

    def still_as_found() -> None:  # just before the rename: another export may have landed there meanwhile
        if identity(destination) != found:
            raise ExportError(f"{destination} was written by another export while this one was made; nothing was "
                              f"replaced and this export is discarded: run stages=[export] again (with "
                              f"export.overwrite=true to replace it), or choose another export.dir")
        export_destination(ctx.run_dir, settings)

    with published(destination, directory=True, check=still_as_found) as staging:
        written = kind.export(job, staging)
        engine = written.engine
        warning = evaluated.verdict if evaluated else None
        write_serving_files(staging / "serving", written.flags, warning, engine_warnings(job.engines, engine))
        checks = {**written.checks.to_json(), **({ENGINE_CHECK: engine.to_json()} if engine else {})}
        if settings.vllm_check and "vllm" in written.record.files:
            checks[VLLM_CHECK] = served_by_vllm(job, staging, written).to_json()
        result = ExportResult(draft_fingerprint=draft.fingerprint, export_path=str(destination), gamma=job.gamma,
                              evaluated=evaluated is not None, flags=written.flags, round_trip=checks)
        record = ExportRecord(result=result, worth_serving=warning is None if evaluated else None,
                              step_costs=serving_step_costs(evaluated, engine, job.gamma), **vars(written.record))
        (staging / RECORD_FILE).write_text(json.dumps(record.to_json(), indent=2) + "\n")
        (staging / "README.md").write_text(model_card(record, kind, draft, config))
    return result


def served_by_vllm(job: ExportJob, staging: Path, written) -> VllmCheck:
    """The staged draft/ served by vLLM beside the target alone on the verify prompts
    (decode/export/vllm_engine_check.py); an ExportMismatch when vLLM refuses it or drafts nothing."""
    spec = VllmSpec(job.target.hf_path, str(staging / written.record.files["vllm"]),
                    **vllm_draft_settings(written.flags.vllm_speculative_config), gamma=job.gamma)
    draft = load_draft(job.ctx.pair.target, job.ctx.pair.tokenizer, job.draft_spec)[0]
    check = vllm_check(spec, job.verify_ids, job.max_new_tokens, job.ctx.run_dir / "vllm_check",
                       job.ctx.pair.decoder(draft))
    log.info(format_check(check))
    return check


def serving_step_costs(evaluated: EvalResult | None, engine: EngineCheck | None,
                       gamma: int) -> ServingStepCosts | None:
    """The step costs of the engine this export is most likely served by, for the monitor's break-even
    threshold: llama.cpp's own (llama-bench) when the engine check measured them, else our decoder's."""
    if engine is not None and engine.has_step_costs:
        return ServingStepCosts(engine="llama.cpp", gamma=engine.gamma, c=engine.c, v=engine.v)
    if evaluated is not None and evaluated.step_costs:
        costs = evaluated.step_costs
        return ServingStepCosts(engine="decoder", gamma=gamma, c=costs.c, v=costs.v)
    return None


