"""Secrets never leave the process: a password in a URL, a token in a query, a key on the command line are
redacted in every file a run writes (its config.yaml, Hydra's record, the model card, the logs) and on the console.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from decode.redact import redact_argument, redact_text, scrub_secrets

ROOT = Path(__file__).resolve().parents[1]
PASSWORD, QUERY_KEY, QUERY_TOKEN = "s3cretPW", "QKEY123", "QTOK456"
HF_TOKEN = "hf_" + "Ab3" * 12
SERVER_URL = f"http://alice:{PASSWORD}@127.0.0.1:9/v1?api_key={QUERY_KEY}&token={QUERY_TOKEN}"
REDACTED_URL = "http://***@127.0.0.1:9/v1?api_key=***&token=***"
SECRETS = (PASSWORD, QUERY_KEY, QUERY_TOKEN, HF_TOKEN)


def train(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """python -m train on the tiny pair, started in tmp_path (Hydra's outputs/ lands there), with the server URL
    and an HF token on its command line."""
    command = [sys.executable, "-m", "train", "+domain=code", "+debug=tiny", "domain.code_excerpts=0",
               f"generate.server_url='{SERVER_URL}'", f"+hydra.job.env_set.HF_TOKEN={HF_TOKEN}",
               f"run_dir={tmp_path / 'run'}", *overrides]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled", "SPECDRAFT_CACHE": str(tmp_path / "cache")}
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def files_holding_a_secret(directory: Path) -> list[str]:
    return [str(path) for path in directory.rglob("*") if path.is_file()
            and any(secret.encode() in path.read_bytes() for secret in SECRETS)]


@pytest.mark.slow
def test_a_password_in_the_server_url_lands_in_no_file_the_run_writes(tmp_path):
    # the target answers here (generate.answers=in_process): the URL is only a setting, written everywhere settings go
    result = train(tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]

    assert files_holding_a_secret(tmp_path) == []
    assert not any(secret in result.stdout + result.stderr for secret in SECRETS)
    # what was written still says which server, only not with what credentials
    run_dir = tmp_path / "run"
    assert f"server_url: {REDACTED_URL}" in (run_dir / "config.yaml").read_text()
    card = (run_dir / "export" / "README.md").read_text()
    assert f"server_url: {REDACTED_URL}" in card  # the resolved settings
    assert f"generate.server_url='{REDACTED_URL}'" in card.replace("'\"'\"'", "'")  # the command line, shell-quoted
    [hydra_record] = (tmp_path / "outputs").glob(".hydra/*/.hydra")
    assert f"- generate.server_url='{REDACTED_URL}'" in (hydra_record / "overrides.yaml").read_text()
    assert f"server_url: {REDACTED_URL}" in (hydra_record / "config.yaml").read_text()
    assert "HF_TOKEN: '***'" in (hydra_record / "hydra.yaml").read_text()
    assert (run_dir / "export" / "export.json").is_file() and list((tmp_path / "outputs").rglob("__main__.log"))


@pytest.mark.slow
def test_a_server_that_does_not_answer_is_named_without_its_credentials(tmp_path):
    result = train(tmp_path, "generate.answers=server", "stages=[generate]")
    assert result.returncode == 2
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "no server answers at http://***@127.0.0.1:9" in error
    assert not any(secret in result.stdout + result.stderr for secret in SECRETS)
    assert files_holding_a_secret(tmp_path) == []


def test_the_credentials_of_a_url_and_its_secret_query_parameters_are_redacted_at_any_depth():
    config = {
        "generate": {"server_url": SERVER_URL, "server_model": "tiny"},
        "metrics": [{"url": f"https://bob:{PASSWORD}@vllm:8000/metrics"}, {"file": "saved.prom"}],
        "nested": {"deeper": [[f"see https://h/x?key={QUERY_KEY}&page=2 or git+ssh://u:{PASSWORD}@h/r"]]},
        f"http://carol:{PASSWORD}@h:1": "a URL as a key",
        "hub": {"hf_token": HF_TOKEN, "repo": "me/draft"},
        "max_new_tokens": 128,
    }
    scrubbed = scrub_secrets(config)

    assert scrubbed == {
        "generate": {"server_url": REDACTED_URL, "server_model": "tiny"},
        "metrics": [{"url": "https://***@vllm:8000/metrics"}, {"file": "saved.prom"}],
        "nested": {"deeper": [["see https://h/x?key=***&page=2 or git+ssh://***@h/r"]]},
        "http://***@h:1": "a URL as a key",
        "hub": {"hf_token": "***", "repo": "me/draft"},
        "max_new_tokens": 128,
    }
    assert config["generate"]["server_url"] == SERVER_URL  # pure: the input is untouched


@pytest.mark.parametrize("text, expected", [
    (f"wandb.api_key={QUERY_KEY} lr=0.001", "wandb.api_key=*** lr=0.001"),
    (f"{{'api_key': '{QUERY_KEY}', \"password\": \"{PASSWORD}\"}}", "{'api_key': '***', \"password\": \"***\"}"),
    (f"Authorization: Bearer {QUERY_TOKEN}", "Authorization: *** ***"),
    (f"pushed with {HF_TOKEN} and sk-proj-{'x7' * 20}", "pushed with *** and ***"),
    ("max_new_tokens=128 tokenizer=HuggingFaceTB/SmolLM2 tokens: 12", None),
    ("Key 'max_steps' is not in struct\n    full_key: method.max_steps", None),
    ("pair.draft.settings.mask_token=<|mask|> but the draft was trained with mask token 7", None),
    ("commit 4fe47f0a1b2c3d4e5f60718293a4b5c6d7e8f901, sha256 " + "e3b0c442" * 8 + ", key 9d8f750de8559b54", None),
    ("http://127.0.0.1:8000/v1 and https://keycloak:8443/realms?page=2", None),
])
def test_secrets_in_text_are_redacted_and_digests_revisions_and_token_counts_are_not(text, expected):
    assert redact_text(text) == (text if expected is None else expected)


def test_a_secret_override_on_the_command_line_loses_its_whole_value():
    assert redact_argument("+hub.token='two words'") == "+hub.token=***"
    assert redact_argument(f"generate.server_url={SERVER_URL}") == f"generate.server_url={REDACTED_URL}"
    assert redact_argument("method.max_steps=3") == "method.max_steps=3"


@pytest.mark.parametrize("name", ["api_key", "HF_TOKEN", "authToken", "wandb.api_key", "X-Api-Key", "db_password_file",
                                  "client_secret_id", "Authorization", "credentials"])
def test_a_name_ending_in_a_credential_word_or_holding_a_strong_one_is_a_secret(name):
    assert scrub_secrets({name: "v"}) == {name: "***"}


@pytest.mark.parametrize("name", ["token_acceptance", "draft_token_ids", "num_key_value_heads", "max_new_tokens",
                                  "feature_bytes_per_token", "mask_token", "eos_token_ids", "tokens_per_s"])
def test_a_figure_about_tokens_or_keys_stays_visible(name):
    # a report scrubbed for its URLs keeps its figures: token_acceptance is no credential
    assert scrub_secrets({name: 0.5, "url": "http://a:pw@h/v1"}) == {name: 0.5, "url": "http://***@h/v1"}
