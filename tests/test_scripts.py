"""The measuring scripts of scripts/ (gamma_speed, data_scaling, check_engines) run end to end on tiny models: what
each prints agrees with itself and with the runs it made."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from decode.cost_model import predicted_speedup
from decode.run_summary import read_summary
from decode.serving.vllm_server import ServerError, find_python
from decode.sampling import SamplingParams
from scripts import data_scaling, draft_weights_acceptance, gamma_speed

ROOT = Path(__file__).resolve().parents[1]
MODE = re.compile(r"  draft gamma (\d+): ([\d.]+) tok/s = ([\d.]+)x AR \[([\d.]+), ([\d.]+)\], "
                  r"per-token acceptance ([\d.]+) \(by position ([\d., ]+)\)")
COSTS = re.compile(r"draft step costs on the prompts' text: AR step [\d.]+ ms, c = ([\d.]+), (.*); predicted (.*)")


def test_gamma_speed_prints_every_gamma_beside_ar_and_what_the_step_costs_predict(tmp_path, tiny_pair, capsys):
    tiny_pair.draft.save_pretrained(tmp_path / "draft")
    tiny_pair.tokenizer.save_pretrained(tmp_path / "draft")
    gamma_speed.main([str(tmp_path / "draft"), "--target", "tiny-random", "--prompts", "2", "--gammas", "1", "3",
                      "--max-new-tokens", "8"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"draft: {tmp_path / 'draft'} (causal_lm)"
    assert lines[1].startswith("2 held-out code prompts x 8 tokens, one request at a time, temperature 0.7")
    ar_rate = float(re.search(r"AR ([\d.]+) tok/s$", lines[1]).group(1))
    acceptance = {}
    for line, gamma in zip(lines[2:4], (1, 3)):
        match = MODE.fullmatch(line)
        assert match and int(match[1]) == gamma, line
        rate, ratio, low, high, per_token = (float(match[i]) for i in range(2, 7))
        by_position = [float(figure) for figure in match[7].split(", ")]
        assert ratio == pytest.approx(rate / ar_rate, abs=0.01 + 0.1 / ar_rate) and low <= high
        # per-token acceptance is accepted / tested over all positions: within its positions' range
        assert 1 <= len(by_position) <= gamma and min(by_position) - 1e-3 <= per_token <= max(by_position) + 1e-3
        acceptance[gamma] = per_token
    cost_lines = lines[4:]
    assert len(cost_lines) == 2  # the prompts' text, twice; random tokens only when asked
    for line in cost_lines:
        match = COSTS.fullmatch(line)
        assert match, line
        v = dict(re.findall(r"v\((\d+)\) = ([\d.]+)", match[2]))
        predicted = dict((gamma, speedup) for speedup, gamma in re.findall(r"([\d.]+)x at gamma (\d+)", match[3]))
        assert set(v) == set(predicted) == {"1", "3"}
        for gamma in (1, 3):
            expected = predicted_speedup(acceptance[gamma], gamma, float(match[1]), float(v[str(gamma)]), False)
            assert float(predicted[str(gamma)]) == pytest.approx(expected, rel=0.03, abs=0.01)


def test_gamma_speed_runs_each_draft_once_per_decode_weights_setting(tmp_path, tiny_pair, capsys):
    tiny_pair.draft.save_pretrained(tmp_path / "draft")
    tiny_pair.tokenizer.save_pretrained(tmp_path / "draft")
    gamma_speed.main([str(tmp_path / "draft"), "--target", "tiny-random", "--prompts", "2", "--gammas", "1",
                      "--max-new-tokens", "4", "--decode-weights", "float", "int8"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [f"draft (float weights): {tmp_path / 'draft'} (causal_lm)",
                         f"draft (int8 weights): {tmp_path / 'draft'} (causal_lm)"]
    assert [line.split(":")[0] for line in lines[3:5]] == ["  draft (float weights) gamma 1",
                                                           "  draft (int8 weights) gamma 1"]
    assert sum("(int8 weights) step costs" in line for line in lines) == 2


def test_draft_weights_acceptance_scores_the_draft_on_float_and_int8_weights(tiny_pair):
    sequences = [([5, 9, 11, 2, 40, 41, 42, 43, 44], 3), ([7, 7, 1, 30, 31, 32], 2)]
    samplings = {"t1": SamplingParams(temperature=1.0), "t0.7": SamplingParams(temperature=0.7, top_p=0.9)}
    figures = draft_weights_acceptance.acceptance_by_weights(tiny_pair, sequences, samplings)
    assert set(figures) == {"float", "int8"} and all(set(by) == set(samplings) for by in figures.values())
    for name in samplings:
        assert 0 < figures["float"][name] <= 1 and 0 < figures["int8"][name] <= 1
        assert figures["int8"][name] == pytest.approx(figures["float"][name], abs=0.05)
    assert figures["int8"] != figures["float"]  # the int8 weights did decode


@pytest.mark.slow
def test_data_scaling_runs_each_row_and_tabulates_what_its_run_recorded(tmp_path, capsys):
    rows = {"one": "+debug=tiny", "two": "+debug=tiny generate.answers_per_prompt=2"}
    data_scaling.main([str(tmp_path), "--domain", "math", *(f"--row={name}={rows[name]}" for name in rows)])
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header == ["row", "overrides", "target answers", "target tokens", "prompt tokens", "on-policy tokens",
                      "data CPU-minutes", "steps", "train s", "validation"]
    assert len(table) == 2 + len(rows)
    printed = {}
    for line in table[2:]:
        cells = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
        printed[cells["row"]] = cells
        assert cells["overrides"] == f"`{rows[cells['row']]}`"
        summary = read_summary(tmp_path / cells["row"])
        assert int(cells["target answers"]) == summary.generate.train_answers
        assert int(cells["target tokens"]) == summary.train.answer_tokens
        assert int(cells["steps"]) == summary.train.steps and cells["on-policy tokens"] == "0"
        assert cells["validation"] == f"{summary.train.validation_acceptance_end:.3f}"
        assert 0 < float(cells["data CPU-minutes"]) < math.inf
    assert list(printed) == list(rows)
    assert int(printed["two"]["target answers"]) == 2 * int(printed["one"]["target answers"])


@pytest.mark.vllm
@pytest.mark.slow
def test_check_engines_reads_the_eagle3_export_with_vllms_own_config_class():
    """vLLM's modules from its own environment (make vllm), after this environment's packages; SGLang is not
    installed here, and the script says it did not check it."""
    try:
        vllm_python = find_python()
    except ServerError as error:
        pytest.fail(f"the check needs vLLM: {error}")
    site = subprocess.run([vllm_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    run = (f"import runpy, sys; sys.path.append({site!r}); "
           "runpy.run_path('scripts/check_engines.py', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", run], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "ok: vLLM SpeculatorsConfig: {'method': 'eagle3', 'num_speculative_tokens': 3}" in result.stdout
    assert "layers [0, 1, 3]" in result.stdout and "not checked: sglang is not installed" in result.stdout


def test_document_prompts_keeps_each_files_first_long_document_after_a_validation_instruction(tmp_path, tokenizer):
    from distill.magpie import summarization_instructions
    from scripts import document_prompts

    corpus = tmp_path / "corpus"
    (corpus / "packages").mkdir(parents=True)
    paragraph = "The parser reads each line of the file and keeps the words that name a setting of the tool."
    (corpus / "packages" / "a.md").write_text("\n\n".join(f"{paragraph} Part {index}." for index in range(12)))
    (corpus / "packages" / "b.txt").write_text("Too short to be a document here at all, one line of words.")
    (corpus / "packages" / "c.bin").write_bytes(bytes(range(256)))
    (corpus / "other.md").write_text("\n\n".join(f"{paragraph} Elsewhere {index}." for index in range(12)))
    tokenizer_dir = tmp_path / "tokenizer"
    tokenizer.save_pretrained(tokenizer_dir)
    output = tmp_path / "long.jsonl"
    document_prompts.main(["--tokenizer", str(tokenizer_dir), "--corpus", str(corpus), "--under", "packages/",
                           "--min-tokens", "300", "--max-tokens", "600", "-o", str(output)])
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rows) == 1  # one document a file; b.txt too short, c.bin no text, other.md not under packages/
    instruction, document = rows[0]["prompt"].split("\n\n", 1)
    assert instruction in summarization_instructions("validation") and rows[0]["domain"] == "summarization"
    assert document.startswith(paragraph + " Part 0.") and len(tokenizer(document).input_ids) >= 300
    assert "Part 11." not in document  # the run ends within --max-tokens, before the file does
    with pytest.raises(SystemExit):
        document_prompts.main(["--tokenizer", str(tokenizer_dir), "--corpus", str(corpus), "--under", "nothing/",
                               "-o", str(output)])
