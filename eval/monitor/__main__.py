"""python -m eval.monitor [key=value ...]

Watches speculative-decoding acceptance in production, per domain, and says when a domain's draft needs
retraining. Run it from cron or a Kubernetes CronJob at least once per window (window_s, default 1 h).
Each run reads what the sources gave since the last run, judges the windows that are complete, and
alerts after alert_after consecutive windows with alpha = sum(accepted) / sum(drafted) below threshold.
A window with fewer than min_drafted drafted tokens has no data: it neither breaks nor extends a run.
One alert per drift: it stays open, and is not raised again, until the domain has a healthy window.

Sources (at least one; what they give that is malformed, or a failed scrape, is counted and reported,
never fatal, never drift):
  request_logs=[/var/log/gateway/requests-*.jsonl]
      JSONL, a request a line: {"timestamp": ISO-8601 or unix seconds, "domain": "code",
      "prompt": "...", "drafted": 12, "accepted": 9} (from llama-server: timings.draft_n and
      timings.draft_n_accepted)
  metrics=[{url: "http://vllm:8000/metrics"}, {file: saved.prom, domain: code}]
      Prometheus text scraped over HTTP (scrape_timeout_s) or read from a file:
      vLLM          vllm:spec_decode_num_draft_tokens_total, vllm:spec_decode_num_accepted_tokens_total
      llama-server  llamacpp:spec_decode_num_draft_tokens_total, llamacpp:spec_decode_num_accepted_tokens_total
      SGLang        sglang:spec_accept_rate (a gauge: one sample per scrape, samples weighted equally)
      A series' domain is its source's domain, else domains[its domain_label value].

On an alert, retrain_command runs to its end within the run; "{domain}" is the drifted domain, "{prompts}"
a JSONL of the recent prompts to train on (the drifted domain's first), "{run_dir}" the retrain's directory:
  'retrain_command=[python,-m,train,"+domain={domain}","domain.extra_prompts={prompts}","run_dir={run_dir}"]'
a failed retrain runs again on the next run (and resumes in the same run_dir).
With promotion.current=/srv/drafts/current (a symlink to the export serving now), the retrained draft, the
challenger, is decoded against the champion on recent prompts it was not trained on, every domain, and
promoted only if its alpha on the drifted domain beats the champion's by promotion.min_gain and no other
domain loses more than promotion.margin: current then points at <run_dir>/export (one rename) and
promotion.reload_command runs; if that fails, current points at the champion again.
The state lives in state_dir; a monitor started while another runs there does nothing and exits 0.
now=2025-06-01T12:00:00Z replays old logs as of that time.

Exit codes:
  0  healthy, or no data
  1  drift: an alert was raised this run
  2  an error in the monitor's configuration or input (no source configured, an unreadable state,
     an override that does not apply)
"""

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from decode.cli import CONFIG_PATH, register_help
from decode.errors import SpecdraftError
from eval.monitor.config import MonitorConfig, register
from eval.monitor.watch import EXIT_ERROR, EXIT_HEALTHY, run

register()
register_help("monitor", __doc__)
_exit_code = EXIT_HEALTHY  # set by main, read by cli: Hydra's own failures exit 1 too


@hydra.main(config_path=CONFIG_PATH, config_name="monitor", version_base=None)
def main(cfg: DictConfig) -> None:
    global _exit_code
    config: MonitorConfig = OmegaConf.to_object(cfg)
    try:
        _exit_code = run(config).exit_code
    except SpecdraftError as error:
        print(f"error: {error}", file=sys.stderr)
        _exit_code = error.exit_code


def cli() -> int:
    """Run main; -> its exit code. Hydra exits 1 on an override it cannot apply (and on a crash), which would
    read as drift here: that is 2. After --help it exits 0."""
    try:
        main()
    except SystemExit as stop:
        return EXIT_ERROR if stop.code else EXIT_HEALTHY
    return _exit_code


if __name__ == "__main__":
    sys.exit(cli())
