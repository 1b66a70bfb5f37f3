"""python -m eval.monitor [key=value ...]

Watches speculative-decoding acceptance in production, per domain, and says when a domain's draft needs
retraining. Run it from cron at least once per window (window_s, default 1 h); docs/monitor.md has the details
and the cron, Kubernetes and Prometheus-rule examples. Each run reads what the sources gave since the last run
and judges the windows that are complete on their per-token acceptance, accepted / tested (a round tests the
tokens it accepted and the one it rejected, if any), summed over the window; alpha = accepted / drafted is
reported beside it. A window below threshold (0.5) is low; threshold=break_even: the acceptance below which
speculation is slower than the target alone, from the step costs in the export.json of promotion.current.
alert_after (3) consecutive low windows raise one alert, open until a healthy window; a window with fewer than
min_drafted drafted tokens has no data and neither breaks nor extends a run.

Where a source counts no rejections, tested is estimated from alpha at gamma (3: set it to what serving drafts,
llama-server --spec-draft-n-max, vLLM num_speculative_tokens), assuming every round drafts gamma tokens and each
is accepted independently with one probability; the window's line says so.

Sources (at least one; a malformed line or scrape, or a failed scrape, is counted and reported, never fatal,
never drift; so is a log line dated more than 5 minutes after the present, which is not counted):
  request_logs=[/var/log/gateway/requests-*.jsonl]
      JSONL, a request a line: {"timestamp": ISO-8601 or unix seconds, "domain": "code", "prompt": "...",
      "drafted": 12, "accepted": 9, "rejected": 2, "gamma": 5}. "rejected" (rounds whose acceptance test
      failed) makes tested exact; "gamma" (else gamma) is the most tokens a round drafted; "prompt" is optional,
      and so is the response served to it, "response_token_ids" with "served_by" (docs/monitor.md), which the
      retrain scores instead of answering again
  metrics=[{url: "http://vllm:8000/metrics"}, {file: saved.prom, domain: code}]
      Prometheus text scraped over HTTP (scrape_timeout_s) or read from a file:
      vLLM, llama-server  vllm: or llamacpp: spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens,
                          _num_accepted_tokens_per_pos: exact while each round drafts a token per position
      SGLang              sglang:spec_accept_rate, a gauge of alpha: one sample per scrape, estimated
      A series' domain is its source's domain, else domains[its domain_label value]. Counts between scrapes are
      shared between windows by time; windows sharing counts over a gap of more than two windows are marked
      apportioned. Counts for windows already judged are not counted: they are tallied in the state and logged.

On an alert, retrain_command starts as a job of its own, and the run returns; "{domain}" is the drifted
domain, "{prompts}" a JSONL of recent prompts to train on (the drifted domain's, then the latest
promotion.other_domain_prompts of each other domain; each with its latest served response), "{run_dir}" the
retrain's directory, "{champion}" the draft promotion.current points at (to retrain from, so that the draft keeps
the other domains):
  'retrain_command=[python,-m,train,"+domain={domain}","pair.draft.path={champion}","domain.extra_prompts={prompts}","run_dir={run_dir}"]'
Later runs see it running, finished with its exit code, or killed; a failed or killed retrain runs again, in
the same run_dir. With promotion.current=/srv/drafts/current (a symlink to the export serving now), the first run
after a retrain succeeded gates the challenger against the champion on recent prompts it was not trained on, and
promotes it only if it wins (promotion.*: docs/monitor.md): current then points at <run_dir>/export (one rename)
and promotion.reload_command runs; if that fails, current points at the champion again.
The state lives in state_dir; a run started while another holds its lock does nothing and exits 0. A run stops
reading its sources after max_run_s (600) seconds, judges nothing, writes the state and exits 2; the next run
reads on.
now=2025-06-01T12:00:00Z replays old logs as of that time.

Exit codes:
  0  healthy, or no data
  1  drift: an alert was raised this run
  2  an error in the monitor's configuration or input (no source configured, an unreadable state,
     an override that does not apply), or a run stopped at max_run_s
"""

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from decode.cli import CONFIG_PATH, check_command_line, exit_on_user_error, register_help
from eval.monitor.config import MonitorConfig, register
from eval.monitor.watch import EXIT_DRIFT, EXIT_ERROR, EXIT_HEALTHY, run

register()
register_help("monitor", __doc__)
_exit_code = EXIT_HEALTHY  # set by main, read by cli: Hydra's own failures exit 1 too


@hydra.main(config_path=CONFIG_PATH, config_name="monitor", version_base=None)
def main(cfg: DictConfig) -> None:
    global _exit_code
    config: MonitorConfig = OmegaConf.to_object(cfg)
    with exit_on_user_error():
        _exit_code = run(config).exit_code


def cli() -> int:
    """Run main; -> its exit code. A user's error exits with its own code; Hydra exits 1 on an override it cannot
    apply (and on a crash), which would read as drift here: that is 2. After --help it exits 0."""
    try:
        with exit_on_user_error():  # a mistyped key or an option of another command: one line, before any work
            check_command_line("monitor", MonitorConfig, sys.argv[1:])
        main()
    except SystemExit as stop:
        if not stop.code:
            return EXIT_HEALTHY
        return stop.code if isinstance(stop.code, int) and stop.code != EXIT_DRIFT else EXIT_ERROR
    return _exit_code


if __name__ == "__main__":
    sys.exit(cli())
