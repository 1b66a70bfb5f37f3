import logging
import os
from pathlib import Path

import pytest
import torch

from decode.models import ModelSpec
from decode.pair import load_pair
from decode.serving.llama_server import ServerError, find_binary
from decode.tiny import tiny_llama, tiny_tokenizer


# `make check` runs `pytest -m "not slow"` with one thread a process (OMP_NUM_THREADS=1). A test is slow when it takes
# more than about 2 s there on 2 cores (all its parameters together), save the chi-square test of speculative sampling
# and its wrong-rule twin, which the fast tier keeps whatever they take. Slow: what a test's own file marks, every test
# that starts llama-server or vLLM, every test of SLOW_FILES, and the tests SLOW_TESTS names.
SLOW_FILES = {
    "test_champion_retrain.py", "test_help.py",
}
SLOW_TESTS = {
    "test_cli.py": {
        "test_the_command_line_gives_hydras_errors_as_one_line_and_exit_2",
    },
    "test_decode_counts.py": {
        "test_the_drafts_prefill_is_its_own_phase",
    },
    "test_dflash_decoding.py": {
        "test_a_dflash_draft_vocabulary_keeps_the_distribution",
        "test_dflash_drafting_keeps_the_target_distribution",
        "test_dflash_drafting_on_prompts_of_mixed_lengths_in_one_batch_keeps_each_distribution",
        "test_dflash_drafting_with_dynamic_gamma_keeps_the_distribution",
        "test_dflash_drafting_with_top_p_keeps_the_target_distribution",
    },
    "test_draft_kinds.py": {
        "test_speculative_sampling_with_a_bigram_draft_keeps_the_targets_distribution",
    },
    "test_eagle3_decoding.py": {
        "test_a_pruned_eagle3_vocabulary_keeps_the_distribution",
        "test_eagle3_drafting_keeps_the_target_distribution",
        "test_eagle3_drafting_with_top_p_keeps_the_target_distribution",
        "test_eagle3_on_prompts_of_mixed_lengths_in_one_batch_keeps_each_distribution",
        "test_eagle3_with_context_copies_keeps_the_target_distribution",
        "test_eagle3_with_dynamic_gamma_keeps_the_distribution",
    },
    "test_log_files.py": {
        "test_a_job_that_crashes_is_reported_with_its_overrides_and_log_lines_redacted",
        "test_a_log_file_that_is_not_a_regular_file_of_its_own_is_refused_and_nothing_is_written_through_it",
        "test_a_regular_log_file_is_appended_to_run_after_run",
        "test_log_lines_name_a_url_without_its_credentials_in_the_log_file_and_on_the_console",
    },
    "test_mixed_decoding.py": {
        "test_the_mixed_rule_keeps_the_target_distribution",
        "test_the_mixed_rule_on_prompts_of_mixed_lengths_in_one_batch_keeps_each_distribution",
        "test_the_mixed_rule_with_a_pruned_draft_vocabulary_keeps_the_distribution",
        "test_the_mixed_rule_with_dynamic_gamma_keeps_the_distribution",
        "test_the_mixed_rule_with_top_k_or_top_p_keeps_the_target_distribution",
    },
    "test_monitor.py": {
        "test_exit_codes_of_the_command_line_for_healthy_drift_and_error",
    },
    "test_names_and_errors.py": {
        "test_a_domain_name_that_leads_out_of_outputs_is_refused_before_anything_is_written",
    },
    "test_outside_inputs.py": {
        "test_a_prompt_file_holding_control_tokens_is_refused_naming_its_line_id_and_token",
        "test_a_server_answering_token_ids_outside_the_vocabulary_is_refused_and_nothing_is_cached",
        "test_a_server_giving_2_log_probabilities_where_64_were_asked_trains",
        "test_log_probabilities_above_0_are_refused",
        "test_served_prompts_holding_control_tokens_are_dropped_and_no_user_text_becomes_one",
    },
    "test_owned_paths.py": {
        "test_a_live_writers_staging_is_never_removed_by_another_process_and_a_killed_ones_is",
        "test_an_export_into_the_current_directory_is_refused_before_work_and_deletes_nothing",
        "test_export_dir_naming_a_file_is_an_error_line_and_the_file_is_kept",
    },
    "test_pair_checks.py": {
        "test_a_path_that_does_not_exist_is_named_not_looked_up_on_the_hub",
    },
    "test_parallel_decoding.py": {
        "test_a_pruned_parallel_draft_keeps_the_distribution",
        "test_parallel_drafting_keeps_the_target_distribution",
        "test_parallel_drafting_on_prompts_of_mixed_lengths_in_one_batch_keeps_each_distribution",
        "test_parallel_drafting_with_dynamic_gamma_keeps_the_distribution",
        "test_parallel_drafting_with_top_p_keeps_the_target_distribution",
    },
    "test_promotion.py": {
        "test_a_drift_retrains_gates_and_promotes_only_a_better_challenger",
    },
    "test_sampling_and_verify.py": {
        "test_sampling_among_the_candidates_draws_what_the_whole_distribution_draws",
    },
    "test_speculative_exactness.py": {
        "test_a_forced_matmul_route_keeps_the_distribution",
        "test_a_pruned_draft_vocabulary_keeps_the_distribution",
        "test_context_copies_keep_the_distribution",
        "test_dynamic_gamma_keeps_the_distribution",
        "test_prompts_of_different_lengths_in_one_batch_keep_each_distribution",
        "test_rows_that_stop_at_eos_keep_the_distribution_over_shorter_sequences",
    },
    "test_tracking.py": {
        "test_offline_run_lands_under_run_dir_without_secrets_or_leftover_processes",
    },
    "test_train_pipeline.py": {
        "test_a_malformed_prompt_file_stops_the_cli_before_any_model_is_loaded",
        "test_a_run_prints_and_records_its_peak_memory",
        "test_running_without_a_domain_names_the_domains",
    },
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        name = item.path.name
        if (name in SLOW_FILES or getattr(item, "originalname", None) in SLOW_TESTS.get(name, ())
                or item.get_closest_marker("serving") or item.get_closest_marker("vllm")):
            item.add_marker(pytest.mark.slow)
    here = Path(__file__).parent
    stale = [name for name in SLOW_FILES | set(SLOW_TESTS) if not (here / name).is_file()]
    for module in {item.module for item in items if item.path.name in SLOW_TESTS}:
        stale += sorted(SLOW_TESTS[Path(module.__file__).name] - set(vars(module)))
    if stale:
        raise pytest.UsageError(f"tests/conftest.py marks tests that do not exist: {', '.join(stale)}")


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Tests write converted models under a temporary cache, never the user's."""
    previous = os.environ.get("SPECDRAFT_CACHE")
    os.environ["SPECDRAFT_CACHE"] = str(tmp_path_factory.mktemp("specdraft-cache"))
    os.environ.setdefault("WANDB_MODE", "disabled")
    yield
    if previous is None:
        os.environ.pop("SPECDRAFT_CACHE", None)
    else:
        os.environ["SPECDRAFT_CACHE"] = previous


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """A command run in this process (its --help, main()) has Hydra give the root logger handlers on this test's
    captured streams, closed once it ends: they leave with the test, so later tests' logging still works."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in before and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def target64(tokenizer):
    """float64 so that argmax ties between cached and uncached forwards cannot flip greedy tokens."""
    return tiny_llama(len(tokenizer), num_layers=3, seed=1, init_std=0.1, dtype=torch.float64)


@pytest.fixture(scope="session")
def draft64(tokenizer):
    """An unrelated random draft: it disagrees with the target often, so rejections are exercised."""
    return tiny_llama(len(tokenizer), num_layers=1, seed=2, init_std=0.1, dtype=torch.float64)


@pytest.fixture(scope="module")
def tiny_pair():
    """The tiny random target and a draft of its first layer, in float32 on the CPU; one per test module."""
    return load_pair(ModelSpec(path="tiny-random", dtype="float32", device="cpu"),
                     ModelSpec(derive_layers=1, dtype="float32", device="cpu"))


@pytest.fixture(scope="session")
def server_binary():
    """llama-server from the serving extra: a serving test fails, never skips, when it is missing."""
    try:
        return find_binary()
    except ServerError as error:
        pytest.fail(f"the serving tests need llama-server: {error}")
