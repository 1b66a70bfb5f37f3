"""Typed settings of the data side: where a domain's prompts come from, how the target answers them."""

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from decode.errors import ConfigError
from decode.sampling import SamplingParams


@dataclass
class DomainConfig:
    """One domain's prompts. The shipped domains only set `name`; a user's data sets source and path."""

    name: str = "code"
    source: str = "shipped"  # shipped | jsonl | parquet | hf | conversations | magpie | mix
    path: Optional[str] = None  # the file (jsonl, parquet, conversations) or dataset id (hf, conversations)
    fields: Dict[str, str] = field(default_factory=lambda: {"prompt": "prompt", "split": "split", "id": "id"})
    hf_split: str = "train"
    heldout_fraction: float = 0.2  # when the source has no split column
    system_prompt: Optional[str] = None  # None: the chat template's own default
    # a JSONL file of more training prompts ({"prompt": ...} a line), answered first: recent traffic to retrain on
    extra_prompts: Optional[str] = None
    # source magpie: the target writes this many user requests after its template's user header (and the system
    # prompt, which steers the domain), each at most magpie_max_prompt_tokens long, sampled as set here. Source
    # mix: as many more training prompts (0: none; null: one component's share of generate.max_train_prompts)
    magpie_prompts: Optional[int] = 640
    magpie_max_prompt_tokens: int = 256
    magpie_temperature: float = 1.0
    magpie_top_p: float = 1.0
    # source mix: the domains (by name, as +domain=<name>) whose prompts are mixed, each keeping its own train,
    # validation and held-out split, taken in turn so that any max_train_prompts holds as many of each; plus
    # magpie_prompts the target writes, which only ever train (distill/data.py mixed_prompts)
    mix: List[str] = field(default_factory=list)
    # existing code labelled by the target in one teacher-forced forward, trained on beside its answers: this many
    # functions from the installed packages' source (distill/code_text.py), each cut to code_excerpt_tokens
    # tokens (0: none; +domain=code sets 500: BENCHMARKS.md)
    code_excerpts: int = 0
    code_excerpt_tokens: int = 160
    code_root: Optional[str] = None  # the directory whose .py files they come from; None: the site-packages
    # the user's own text labelled and trained on the same way (distill/corpus.py): a folder (read recursively) or
    # one file of text, Markdown, reStructuredText, code or .jsonl conversations; corpus_excerpts of its passages,
    # code blocks and assistant turns, each cut to corpus_excerpt_tokens tokens (0: none)
    corpus: Optional[str] = None
    corpus_excerpts: int = 500
    corpus_excerpt_tokens: int = 160
    # long documents to summarize, training prompts the target answers beside the domain's own (distill/documents.py):
    # document_prompts runs of whole prose paragraphs of one text file of `documents` (a corpus, in domain.corpus's
    # forms, e.g. installed-docs), each of document_tokens / 2 to document_tokens tokens, after a shipped
    # summarization instruction (0: none). Sequences that long need a method.max_length to match (BENCHMARKS.md)
    documents: Optional[str] = None
    document_prompts: int = 0
    document_tokens: int = 800


@dataclass
class GenerateConfig:
    """The target's answers: the training data, sampled as the target will be served."""

    # many short answers: more prompts teach more than long answers, for the same tokens (BENCHMARKS.md)
    max_train_prompts: int = 400
    max_validation_prompts: int = 24  # the training-time metric; never the eval prompts
    max_new_tokens: int = 64
    # the target's answers to each training prompt (sampled, so each differs): more answers per prompt paid more a
    # CPU-minute than the draft's own answers labelled by the target (BENCHMARKS.md, the scaling table), and four
    # answers over 3 epochs more than two over 6 for the same steps
    answers_per_prompt: int = 4
    # prompts answered together: on a CPU, generate times a decode step at batch_size, 2 batch_size, ... up to
    # max_batch_size rows and takes the cheapest a row (distill/generate.py answer_batch_size); on a GPU,
    # max_batch_size. A batch_size at or above max_batch_size, or a model too small to time: batch_size. The
    # target-written prompts (domain.source magpie) keep batch_size
    batch_size: int = 32
    max_batch_size: int = 64
    top_k_logprobs: int = 64  # the target's distribution kept per answer token: its k most likely tokens
    # the training prompts' own tokens labelled too, from the user's message on (one teacher-forced forward of the
    # target a batch): the draft also learns the target on the prompts' text (BENCHMARKS.md)
    label_prompts: bool = True
    autocast: str = "auto"  # bf16 autocast of the target's forwards: auto (CPU: only where measured faster) | bf16 | off
    # who answers (distill/answers_from_server.py): in_process (the target here) | server (an OpenAI-compatible server
    # at server_url: vLLM, SGLang, llama-server) | llama_server (started here on loopback for the target's GGUF)
    answers: str = "in_process"
    # whose teacher-forced labels (the prompts' tokens, code and corpus excerpts, served responses, repeats):
    # in_process (the target here) | server (every label, the answers included, from the servers at server_url and
    # server_urls: vLLM's prompt_logprobs, llama-server a request a position; distill/target_labels.py)
    labels: str = "in_process"
    server_url: Optional[str] = None  # answers=server: its base URL, e.g. http://127.0.0.1:8000/v1
    server_urls: List[str] = field(default_factory=list)  # more servers of the target that share the requests
    server_model: Optional[str] = None  # answers=server: the served model's name; None: the server's default
    server_parallel: int = 8  # requests in flight at once, each server (answers=llama_server: its slots)
    server_retries: int = 5  # a request that failed for a reason that may pass is asked again this often
    shard_size: int = 64  # requests whose results are written together: a killed job loses at most one shard's
    # generate.labels=server: the servers' labels of this many prompts compared with the target's here, and the
    # difference logged (0: none, for a target too big to load here)
    server_check: int = 4
    # None: as `decode` samples, so that the answers are the target's as it will be served
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None

    def sampling(self, decode) -> SamplingParams:
        """The answers' sampling: these settings where set, the decode settings (a DecodeConfig) elsewhere."""
        def chosen(name):
            value = getattr(self, name)
            return getattr(decode, name) if value is None else value

        try:
            return SamplingParams(temperature=chosen("temperature"), top_k=chosen("top_k"), top_p=chosen("top_p"))
        except ValueError as error:
            raise ConfigError(f"generate: {error}") from None


def check_magpie_settings(domain_cfg: DomainConfig) -> SamplingParams:
    """The sampling of the target-written prompts, with every magpie setting checked (before a model loads)."""
    if domain_cfg.magpie_prompts is None:
        raise ConfigError("domain.magpie_prompts: null (one component's share of generate.max_train_prompts) is for "
                          "source mix; set the number of prompts the target writes")
    if domain_cfg.magpie_prompts < 1 or domain_cfg.magpie_max_prompt_tokens < 1:
        raise ConfigError(f"domain.magpie_prompts and domain.magpie_max_prompt_tokens must be >= 1, got "
                          f"{domain_cfg.magpie_prompts} and {domain_cfg.magpie_max_prompt_tokens}")
    if domain_cfg.magpie_temperature <= 0:
        raise ConfigError(f"domain.magpie_temperature must be > 0 (greedy would write one prompt), got "
                          f"{domain_cfg.magpie_temperature}")
    try:
        return SamplingParams(temperature=domain_cfg.magpie_temperature, top_p=domain_cfg.magpie_top_p)
    except ValueError as error:
        raise ConfigError(f"domain.magpie_*: {error}") from None
