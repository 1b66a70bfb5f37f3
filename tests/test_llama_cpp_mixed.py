"""llama.cpp's lookups as ported, and the mixed rule replayed over the target's answers: the same rounds and
counters, in distribution, as llama-server's own loop of drafting and sample-and-match."""

import random

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from decode.llama_cpp_lookup import NgramMapK, ngram_simple_draft
from decode.llama_cpp_mixed import MixedCounts, draft_along, replay


def test_ngram_simple_copies_after_the_latest_earlier_occurrence_of_the_last_n_tokens():
    #          0  1  2  3  4  5  6  7  8  9 10 11 12 13
    history = [9, 1, 2, 3, 4, 5, 1, 2, 7, 8, 6, 6, 6, 1]
    # the last two tokens are 1 (history) and 2 (sampled): 1 2 occurs at 1 and at 6, the latest wins
    assert ngram_simple_draft(history, 2, size_n=2, size_m=4) == [7, 8, 6, 6]
    assert ngram_simple_draft(history, 5, size_n=2, size_m=4) == []  # 1 5 never occurred
    assert ngram_simple_draft(history[:7], 2, size_n=2, size_m=4) == []  # history not longer than n + m + 1


def test_ngram_simple_needs_n_tokens_after_the_match_and_never_matches_position_zero():
    assert ngram_simple_draft([1, 2, 3, 4, 5, 6, 7, 8, 9, 1], 2, size_n=2, size_m=4) == []  # only position 0
    # in a run of one token the latest occurrence overlaps the suffix: 1 token follows it, fewer than n = 4
    assert ngram_simple_draft([0] + [7] * 10, 7, size_n=4, size_m=4) == []
    history = [0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 1, 2, 3]
    assert ngram_simple_draft(history, 4, size_n=4, size_m=4) == [5, 1, 2, 3]


def test_ngram_map_k_copies_the_first_occurrence_it_stored_and_caps_a_key_at_its_last_accepted_count():
    lookup = NgramMapK(size_n=2, size_m=3)
    prompt = [5, 1, 2, 3, 4, 6, 1, 2, 7, 8, 9, 0, 0]
    lookup.begin(prompt)
    # 1 2 occurs at 1 and at 6; the first search runs from the latest position down and stores every position
    # from there down, so the latest stays stored
    assert lookup.draft(prompt, 1) == []  # 0 1 never occurred
    history = prompt + [1]
    assert lookup.draft(history, 2) == [7, 8, 9]
    lookup.accepted(1)
    assert lookup.draft(history, 2) == [7]  # the same key, capped at what its last draft had accepted
    lookup.accepted(0)
    assert lookup.draft(history, 2) == []  # a key that got nothing drafts nothing from then on


def test_ngram_map_k_needs_m_plus_one_tokens_after_the_match():
    lookup = NgramMapK(size_n=2, size_m=3)
    history = [0, 0, 0, 0, 0, 0, 1, 2, 9, 0, 1]  # 1 2 at 6 is followed by 3 tokens, the suffix's included
    lookup.begin(history)
    assert lookup.draft(history, 2) == []
    history = [0, 0, 0, 0, 0, 1, 2, 9, 9, 0, 1]  # at 5 by 4: enough
    lookup = NgramMapK(size_n=2, size_m=3)
    lookup.begin(history)
    assert lookup.draft(history, 2) == [9, 9, 0]


def test_a_history_shorter_than_the_last_drops_what_was_stored_past_it():
    lookup = NgramMapK(size_n=2, size_m=2)
    long_history = [3, 1, 2, 4, 5, 6, 7, 8, 9, 1, 2, 4, 5, 6, 0]
    lookup.begin(long_history)
    assert lookup.draft(long_history, 3) == []
    assert lookup.key_map  # positions hashed
    lookup.begin([3, 1, 2])
    assert not lookup.key_map and not lookup.keys


def _fixed_draft(answer):
    return list(answer), [1.0] * len(answer)


def test_a_lookup_that_never_matches_leaves_the_draft_models_counters_as_they_are():
    rng = random.Random(0)
    prompt = list(range(100, 140))
    answer = list(range(200, 260))  # no n-gram repeats: the lookup never drafts
    argmax = [token if rng.random() < 0.6 else -5 for token in answer]
    alone = replay(prompt, answer, argmax, [1.0] * len(answer), 64, 3, lookup=None)
    mixed = replay(prompt, answer, argmax, [1.0] * len(answer), 64, 3, lookup=lambda: NgramMapK(size_n=2, size_m=8))
    assert mixed == alone and mixed.lookup_rounds == 0 and alone.model_rounds > 0


def test_a_repeated_answer_is_drafted_by_the_lookup_and_the_model_fills_the_rest():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    answer = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 40]
    argmax = [-1] * len(answer)  # the model never guesses right
    counts = replay(prompt, answer, argmax, [1.0] * len(answer), 32, 2,
                    lookup=lambda: NgramMapK(size_n=2, size_m=4))
    assert counts.lookup_rounds >= 1 and counts.lookup_accepted >= 4
    assert counts.model_accepted == 0
    assert counts.draft_n == counts.lookup_drafted + counts.model_drafted
    # every round emits its accepted tokens and one of the target's own
    assert counts.target_forwards + counts.draft_n_accepted == len(answer) - 1
    # each forward by the tokens it verified; at p-min 0 the model runs one forward a token it drafts, the lookup none
    assert sum(counts.forwards_by_drafted.values()) == counts.target_forwards
    assert sum(drafted * forwards for drafted, forwards in counts.forwards_by_drafted.items()) == counts.draft_n
    assert counts.draft_steps == counts.model_drafted


def test_p_min_stops_the_models_draft_and_off_path_decides_its_length_after_a_mismatch():
    prompt, answer = [7, 7, 7], [1, 2, 3, 4, 5, 6, 8, 9]
    argmax = [1, 2, 0, 4, 5, 6, 8, 9]
    with pytest.raises(ValueError, match="off_path"):
        replay(prompt, answer, argmax, [0.9] * 8, 16, 3, p_min=0.5, lookup=None)
    lengths = []

    def off_path(context, most):
        lengths.append(most)
        return 0

    counts = replay(prompt, answer, argmax, [0.9, 0.9, 0.9, 0.2, 0.9, 0.9, 0.9, 0.9], 16, 3, p_min=0.5,
                    off_path=off_path, lookup=None)
    # round 1 from answer[1]: 2 accepted, 0 drafted at answer[3] (mismatch at 2: off path asked for 1 more)
    assert lengths and counts.model_drafted < 3 * counts.model_rounds
    # a draft p-min stopped ran one forward more than it kept: the one whose token it refused
    assert counts.draft_steps > counts.model_drafted


# ---- the replay against llama-server's loop, run directly on a toy target -------------------------------------

VOCAB = 5
TRANSITIONS = np.random.default_rng(3).dirichlet(np.full(VOCAB, 0.3), size=VOCAB)  # peaked: repeats are common
DRAFT_TRANSITIONS = 0.6 * TRANSITIONS + 0.4 * np.random.default_rng(4).dirichlet(np.ones(VOCAB), size=VOCAB)
P_MIN = 0.45


def _draft_step(context):
    row = DRAFT_TRANSITIONS[context[-1]]
    return int(row.argmax()), float(row.max())


def _server_loop(prompt, max_new, draft_n_max, rng, lookup_type):
    """llama-server's loop for one request: the lookup first, else the model's greedy draft; sample-and-match."""
    sample = lambda context: int(rng.choice(VOCAB, p=TRANSITIONS[context[-1]]))
    lookup = lookup_type() if lookup_type else None
    if lookup:
        lookup.begin(prompt)
    answer = [sample(prompt)]
    counts = MixedCounts()
    while len(answer) < max_new:
        context = prompt + answer
        cap = max_new - len(answer) - 1
        drafted = lookup.draft(context[:-1], context[-1])[:cap] if lookup and cap > 0 else []
        by_lookup = bool(drafted)
        while not by_lookup and len(drafted) < min(draft_n_max, cap):
            token, confidence = _draft_step(context + drafted)
            counts.draft_steps += 1
            if confidence < P_MIN:
                break
            drafted.append(token)
        accepted = 0
        for token in drafted:
            target_token = sample(prompt + answer)
            answer.append(target_token)
            if target_token != token:
                break
            accepted += 1
        else:
            answer.append(sample(prompt + answer))
        counts.target_forwards += 1
        if by_lookup:
            counts.lookup_rounds, counts.lookup_drafted = counts.lookup_rounds + 1, counts.lookup_drafted + len(drafted)
            counts.lookup_accepted += accepted
            lookup.accepted(accepted)
        elif drafted:
            counts.model_rounds, counts.model_drafted = counts.model_rounds + 1, counts.model_drafted + len(drafted)
            counts.model_accepted += accepted
    return answer[:max_new], counts


def _replayed(prompt, max_new, draft_n_max, rng, lookup_type):
    answer = [int(rng.choice(VOCAB, p=TRANSITIONS[prompt[-1]]))]
    while len(answer) < max_new:
        answer.append(int(rng.choice(VOCAB, p=TRANSITIONS[answer[-1]])))
    steps = [_draft_step(prompt + answer[:i]) for i in range(len(answer))]

    def off_path(context, most):
        drafted = 0
        while drafted < most and _draft_step(context)[1] >= P_MIN:
            context = context + [_draft_step(context)[0]]
            drafted += 1
        return drafted

    return replay(prompt, answer, [s[0] for s in steps], [s[1] for s in steps], max_new, draft_n_max,
                  p_min=P_MIN, off_path=off_path, lookup=lookup_type)


@pytest.mark.parametrize("lookup_type", [None, lambda: NgramMapK(size_n=2, size_m=6)])
def test_the_replay_counts_what_the_servers_loop_counts_in_distribution(lookup_type):
    rng = np.random.default_rng(11)
    prompts = [[int(t) for t in rng.integers(0, VOCAB, size=int(rng.integers(12, 30)))] for _ in range(600)]
    direct = [_server_loop(prompt, 40, 3, rng, lookup_type)[1] for prompt in prompts]
    replayed = [_replayed(prompt, 40, 3, rng, lookup_type) for prompt in prompts]
    for field in ("draft_n_accepted", "draft_n", "target_forwards", "lookup_rounds", "draft_steps"):
        values = [getattr(c, field) for c in direct] + [getattr(c, field) for c in replayed]
        if len(set(values)) == 1:
            continue
        edges = np.unique(np.quantile(values, np.linspace(0, 1, 7)[1:-1]))
        table = np.array([np.bincount(np.searchsorted(edges, [getattr(c, field) for c in side], side="right"),
                                      minlength=len(edges) + 1) for side in (direct, replayed)])
        table = table[:, table.sum(0) > 0]
        assert chi2_contingency(table).pvalue > 1e-3, (field, table)
    if lookup_type is not None:
        assert sum(c.lookup_rounds for c in replayed) > 100  # the lookup drafted in this test


# ---- on a real draft: teacher-forced greedy tokens, and a lookup that pays where the answer copies --------------

def test_the_drafts_tokens_along_an_answer_are_its_own_argmax_reading_the_tokens_before_each(tiny_pair):
    import torch

    drafter = tiny_pair.kind.drafter(tiny_pair.draft_runner())
    tokens = tiny_pair.encode_chat(["a prompt"])[0] + [5, 9, 13, 2, 7]
    first = len(tokens) - 5
    argmax, confidence = draft_along(drafter, tokens, first)
    with torch.no_grad():
        logits = tiny_pair.draft(torch.tensor([tokens])).logits[0, first - 1:-1]
    assert argmax == logits.argmax(-1).tolist()
    assert all(0 < c <= 1 for c in confidence) and len(confidence) == 5


def test_without_validation_answers_llama_cpps_defaults_are_replayed_and_pay_on_answers_that_copy_the_prompt(
        tiny_pair):
    from eval.llama_cpp_mixed import NO_VALIDATION, Answers, mixed_figures

    drafter = tiny_pair.kind.drafter(tiny_pair.draft_runner())
    rng = random.Random(1)
    span = [rng.randrange(10, 60) for _ in range(60)]
    prompts = [span + [rng.randrange(10, 60) for _ in range(5)] for _ in range(3)]
    copying = mixed_figures(drafter, "draft-simple", Answers(prompts, [span[:50] for _ in prompts], 64), None, 2,
                            0.0, [0])
    assert (copying.spec_type, copying.size_n, copying.size_m) == ("ngram-map-k,draft-simple", 12, 48)
    assert copying.defaults_because == NO_VALIDATION and copying.validation_prompts == 0
    assert copying.lookup_rounds > 0 and copying.gain > 1.5 and copying.tokens_per_forward > 3 and copying.pays


def test_a_lookup_that_matches_nothing_leaves_the_drafts_figures_unchanged(tiny_pair):
    from eval.llama_cpp_mixed import Answers, mixed_figures

    drafter = tiny_pair.kind.drafter(tiny_pair.draft_runner())
    rng = random.Random(1)
    prompts = [[rng.randrange(10, 60) for _ in range(65)] for _ in range(6)]
    # no answer token occurs twice, nor in the prompts: no key of any n is ever found
    distinct = [rng.sample(range(60, 250), 50) for _ in prompts]
    figures = mixed_figures(drafter, "draft-simple", Answers(prompts[:3], distinct[:3], 64),
                            Answers(prompts[3:], distinct[3:], 64), 2, 0.0, [0])
    assert figures.lookup_rounds == 0 and figures.gain == 1.0 and not figures.pays
    assert figures.tokens_per_forward == figures.alone_tokens_per_forward
    assert figures.validation_tokens_per_forward == figures.validation_alone_tokens_per_forward
    # every setting ties on validation: the larger n, then the smaller m
    assert (figures.spec_type, figures.size_n, figures.size_m) == ("ngram-map-k,draft-simple", 12, 4)


def test_the_lookup_is_chosen_on_the_validation_answers_even_where_the_held_out_ones_prefer_another(tiny_pair):
    from eval.llama_cpp_mixed import LOOKUP_GRID, Answers, Replays, choose_lookup, mixed_figures, tokens_per_forward

    drafter = tiny_pair.kind.drafter(tiny_pair.draft_runner())
    rng = random.Random(1)
    span = [rng.randrange(10, 60) for _ in range(60)]
    # held-out answers copy a long span of their prompts; validation answers repeat a short phrase of their own
    heldout = Answers([span + [rng.randrange(10, 60) for _ in range(5)] for _ in range(3)], [span[:50]] * 3, 64)
    phrase = [rng.randrange(60, 120) for _ in range(5)]
    validation = Answers([[rng.randrange(10, 60) for _ in range(30)] for _ in range(3)], [phrase * 10] * 3, 64)
    on_validation, _ = choose_lookup(Replays(drafter, validation, 2, 0.0, [0]), None)
    heldout_replays = Replays(drafter, heldout, 2, 0.0, [0])
    on_heldout, heldout_best = choose_lookup(heldout_replays, None)
    figures = mixed_figures(drafter, "draft-simple", heldout, validation, 2, 0.0, [0])
    assert figures.lookup == on_validation != on_heldout
    assert figures.spec_type == f"{on_validation.spec_type},draft-simple"
    assert tokens_per_forward(heldout_best) > figures.tokens_per_forward  # held-out would have preferred its own
    assert figures.tokens_per_forward == tokens_per_forward(heldout_replays.counts(on_validation))
    assert (figures.validation_prompts, figures.settings_tried, figures.defaults_because) == (3, len(LOOKUP_GRID), None)
    assert figures.validation_tokens_per_forward > 3 > figures.validation_alone_tokens_per_forward


def test_the_validation_answers_are_read_from_the_generate_stages_dataset(tmp_path):
    from datasets import Dataset

    from eval.llama_cpp_mixed import answers_on_disk

    Dataset.from_dict({"input_ids": [[1, 2, 3, 4, 5], [9, 9], [6, 7, 8]], "prompt_length": [3, 2, 1],
                       "stopped_by_eos": [True, True, False]}).save_to_disk(str(tmp_path / "validation"))
    answers = answers_on_disk(str(tmp_path / "validation"), 12)  # an empty answer has no rounds: left out
    assert (answers.prompts, answers.answers, answers.max_new_tokens) == ([[1, 2, 3], [6]], [[4, 5], [7, 8]], 12)
    assert answers_on_disk(str(tmp_path / "removed"), 12) is None


def test_a_lookup_setting_names_llama_servers_flags_and_runs_the_ported_lookup():
    from decode.llama_cpp_lookup import LookupSetting, NgramSimple, spec_type_arguments

    simple = LookupSetting("ngram-simple", 2, 4)
    history = [9, 1, 2, 3, 4, 5, 1, 2, 7, 8, 6, 6, 6, 1]
    lookup = simple.new()
    assert isinstance(lookup, NgramSimple) and lookup.draft(history, 2) == ngram_simple_draft(history, 2, 2, 4)
    assert isinstance(LookupSetting("ngram-map-k", 3, 8).new(), NgramMapK)
    assert spec_type_arguments("draft-simple", simple) == ["--spec-type", "ngram-simple,draft-simple",
                                                            "--spec-ngram-simple-size-n", "2",
                                                            "--spec-ngram-simple-size-m", "4"]
    assert spec_type_arguments("draft-simple") == ["--spec-type", "draft-simple"]
    with pytest.raises(ValueError, match="ngram-mod"):
        LookupSetting("ngram-mod", 24, 48)


def test_with_a_p_min_the_draft_is_run_on_past_a_mismatch_to_find_where_it_stops(tiny_pair):
    import statistics

    from eval.llama_cpp_mixed import Answers, mixed_figures

    drafter = tiny_pair.kind.drafter(tiny_pair.draft_runner())
    rng = random.Random(2)
    prompts = [[rng.randrange(10, 60) for _ in range(20)] for _ in range(2)]
    answers = [[rng.randrange(10, 60) for _ in range(12)] for _ in prompts]
    confidences = [c for prompt, answer in zip(prompts, answers) for c in draft_along(drafter, prompt + answer,
                                                                                          len(prompt))[1]]
    p_min = statistics.median(confidences)  # about half the positions stop the draft
    free = mixed_figures(drafter, "draft-simple", Answers(prompts, answers, 64), None, 3, 0.0, [0])
    stopped = mixed_figures(drafter, "draft-simple", Answers(prompts, answers, 64), None, 3, p_min, [0])
    assert free.draft_n == 3 * free.rounds  # p-min 0: every round drafts gamma tokens
    assert 0 < stopped.draft_n < free.draft_n


# ---- the rounds priced in step costs: time per token, not target forwards, chooses and decides -----------------

def _cpu_like():
    """A CPU's llama-server: a verify of k drafted tokens costs about k + 1 AR steps (llama-bench's v(1) is about 2)."""
    from decode.llama_cpp_round_costs import RoundCosts

    return RoundCosts("llama.cpp", 0.2, {k: 1 + 0.9 * k for k in range(1, 9)})


def _gpu_like():
    """A GPU's: a verify of a few tokens costs one AR step, whatever k."""
    from decode.llama_cpp_round_costs import RoundCosts

    return RoundCosts("llama.cpp", 0.05, {k: 1.0 for k in range(1, 9)})


def _repeats_with_changes(rng, prompts, every):
    """Answers that repeat a 60-token phrase of their prompt three times, each copy changed at one token in `every`:
    a long lookup copies far past the next change, where its draft is rejected."""
    from eval.llama_cpp_mixed import Answers

    phrases = [[rng.randrange(60, 150) for _ in range(60)] for _ in range(prompts)]
    answers = []
    for phrase in phrases:
        answer = []
        for _ in range(3):
            copy = list(phrase)
            for position in range(rng.randrange(every), len(copy), every):
                copy[position] = rng.randrange(150, 250)
            answer += copy
        answers.append(answer)
    return Answers([[rng.randrange(10, 60) for _ in range(10)] + phrase for phrase in phrases], answers, 256)


def test_with_verify_costs_growing_with_the_tokens_long_mostly_rejected_lookups_are_not_chosen_for_fewer_forwards(
        tiny_pair):
    from eval.llama_cpp_mixed import Replays, choose_lookup

    drafter = tiny_pair.kind.drafter(tiny_pair.draft_runner())
    replays = Replays(drafter, _repeats_with_changes(random.Random(3), 3, 20), 2, 0.0, [0])
    cpu = _cpu_like()
    by_forwards, forwards_counts = choose_lookup(replays, None)
    by_time, time_counts = choose_lookup(replays, cpu)
    forwards_total, time_total = sum(forwards_counts, MixedCounts()), sum(time_counts, MixedCounts())
    # the forwards' choice drafts long lookups, most of their tokens rejected, and saves target forwards by them
    assert by_forwards.size_m > by_time.size_m
    assert forwards_total.lookup_accepted < forwards_total.lookup_drafted / 2
    assert forwards_total.target_forwards < time_total.target_forwards
    # ... and costs more: a verify of many tokens costs many steps on this engine
    assert cpu.request_cost(time_total) < cpu.request_cost(forwards_total)
    # where a verify costs one step whatever it verifies, time and forwards choose alike
    assert choose_lookup(replays, _gpu_like())[0] == by_forwards


def test_the_lookup_first_is_not_run_where_it_saves_forwards_but_its_predicted_speed_is_not_above_1(tiny_pair):
    from decode.export.lookup_card import mixed_line
    from eval.llama_cpp_mixed import mixed_figures

    drafter = tiny_pair.kind.drafter(tiny_pair.draft_runner())
    heldout = _repeats_with_changes(random.Random(5), 4, 20)
    cpu = _cpu_like()
    forwards_only = mixed_figures(drafter, "draft-simple", heldout, None, 2, 0.0, [0])
    timed = mixed_figures(drafter, "draft-simple", heldout, None, 2, 0.0, [0], cpu)
    # llama.cpp's defaults (m 48) on both: fewer target forwards beyond doubt, a slower server beyond doubt
    assert timed.lookup == forwards_only.lookup and timed.gain_interval == forwards_only.gain_interval
    assert timed.gain_interval[0] > 1 and forwards_only.pays
    low, high = timed.speed_ratio_interval
    assert low <= timed.speed_ratio <= high < 1 and not timed.pays
    assert timed.speed_ratio == pytest.approx(timed.alone_steps_per_token / timed.steps_per_token)
    assert (timed.step_costs, timed.draft_cost, timed.verify_costs) == ("llama.cpp", 0.2, dict(cpu.verify))
    assert timed.verify_slope == pytest.approx(0.9)
    line = mixed_line(timed)
    assert line.index(f"predicted {timed.speed_ratio:.3f}x [{low:.3f}, {high:.3f}] the speed of the draft model by "
                      f"itself") < line.index("tokens per target forward")
    assert ("llama.cpp step costs: draft c = 0.200, verify v(1) = 1.90 to v(8) = 8.20, then +0.900 a drafted token"
            in line)
    assert line.endswith("not above 1: the export runs the draft model alone")
    assert "no step costs measured: target forwards decide" in mixed_line(forwards_only)
