//! Command-line flags of `kvgate bench`. Names follow vLLM's `benchmark_serving.py` where the
//! concept is the same (`--request-rate`, `--burstiness`, `--ramp-up-*`, `--ignore-eos`,
//! `--random-*`, `--prefix-repetition-*`); the contract spellings (`--rate`, `--num-requests`)
//! are primary and the vLLM ones are aliases.

use std::path::PathBuf;

/// Which OpenAI endpoint to call.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Api {
    /// `POST /v1/chat/completions` with `messages`.
    #[default]
    Chat,
    /// `POST /v1/completions` with `prompt`.
    Completions,
}

/// How the rate moves from `--ramp-up-start-rps` to `--ramp-up-end-rps`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RampUpStrategy {
    /// Linear in the request index (or in time with only `--duration`).
    #[default]
    Linear,
}

/// Flags of `kvgate bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Target base URL (e.g. http://127.0.0.1:8080). Repeat to compare targets: every target
    /// receives the same requests at the same scheduled times, interleaved in one run.
    /// `[LABEL=]URL,URL,...` makes one target of several gateway replicas: each request goes
    /// to one of them drawn at random, as a client-side or L4 balancer would send it.
    #[arg(
        long = "url",
        alias = "base-url",
        required_unless_present = "from_records",
        value_name = "URL"
    )]
    pub urls: Vec<String>,

    /// Send nothing: summarise the requests of a `--records` file instead, by the same
    /// definitions and SLO flags (one report per target and offered rate in it, and their
    /// capacity). Scripts pick records (a window around a fault, displaced sessions' turns)
    /// and leave the percentiles, attainment and capacity to this.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["urls", "sweep"])]
    pub from_records: Option<PathBuf>,

    /// With `--from-records`: report only the requests sent in `[FROM, TO)` seconds into the
    /// run (repeatable: one report per window, target and rate, each naming its window).
    #[arg(
        long = "window",
        value_name = "FROM:TO",
        requires = "from_records",
        allow_hyphen_values = true
    )]
    pub windows: Vec<String>,

    /// The engines behind a target, `URL,URL,...`; repeat once per target in `--url` order.
    /// Their requests running plus waiting are sampled every 100 ms and reported as herding
    /// (the busiest engine's count minus the mean).
    #[arg(long = "engines", value_name = "URLS")]
    pub engines: Vec<String>,

    /// Workload: `random`, `prefix-repetition`, `agentic`, `fanout`, or a JSONL file to replay.
    /// `agentic` and `fanout` are the simulator's models (`kvgate sim --scenario mix`,
    /// `fanout`), closed loop: a turn follows its predecessor's answer.
    #[arg(long, default_value = "random", value_name = "NAME|FILE")]
    pub workload: String,

    /// Offered request rate per target in requests per second (`inf` sends all at once).
    /// For `agentic` it is the rate at which sessions start, for `fanout` the rate of bursts.
    #[arg(
        long,
        alias = "request-rate",
        default_value_t = 10.0,
        conflicts_with = "sweep"
    )]
    pub rate: f64,

    /// Sweep offered rates `A:B:STEP` (inclusive); reports each target's capacity.
    #[arg(long, value_name = "A:B:STEP")]
    pub sweep: Option<String>,

    /// Minimum SLO attainment (0..1) for a swept rate to count as within capacity.
    #[arg(long, default_value_t = 0.9)]
    pub capacity_attainment: f64,

    /// Gamma shape of inter-arrival gaps: CV = 1/sqrt(B); 1.0 = Poisson.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,

    /// Ramp-up strategy (vLLM spelling); only `linear` exists and it is implied by the rates.
    #[arg(long, value_enum)]
    pub ramp_up_strategy: Option<RampUpStrategy>,

    /// Linear ramp-up: rate at the start (requires --ramp-up-end-rps).
    #[arg(long, requires = "ramp_up_end_rps")]
    pub ramp_up_start_rps: Option<f64>,

    /// Linear ramp-up: rate at the end (requires --ramp-up-start-rps).
    #[arg(long, requires = "ramp_up_start_rps")]
    pub ramp_up_end_rps: Option<f64>,

    /// Requests sent (at the first rate, to every target) before measuring, to warm caches;
    /// they are not reported and the measured requests differ from them.
    #[arg(long, default_value_t = 0)]
    pub warmup_requests: u64,

    /// Stop scheduling after this many seconds (per rate in a sweep).
    #[arg(long, value_name = "S")]
    pub duration: Option<f64>,

    /// Stop after this many requests per target (default 1000 when --duration is absent).
    #[arg(long, alias = "num-prompts", value_name = "N")]
    pub num_requests: Option<u64>,

    /// TTFT SLO in milliseconds.
    #[arg(long, value_name = "X")]
    pub slo_ttft_ms: Option<f64>,

    /// TPOT SLO in milliseconds.
    #[arg(long, value_name = "Y")]
    pub slo_tpot_ms: Option<f64>,

    /// Write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Draw latency CDFs (and sweep curves) to this .svg or .png file.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,

    /// Write every measured request (not the warm-up) as a JSON line to this file.
    #[arg(long, value_name = "FILE")]
    pub records: Option<PathBuf>,

    /// Model name sent in requests; default: first id from the target's /v1/models.
    #[arg(long)]
    pub model: Option<String>,

    /// API flavour.
    #[arg(long, value_enum, default_value_t = Api::Chat)]
    pub api: Api,

    /// Send `ignore_eos: true` so every request generates exactly its output length.
    #[arg(long)]
    pub ignore_eos: bool,

    /// Override every workload's output length (max_tokens).
    #[arg(long, value_name = "TOKENS")]
    pub output_len: Option<u32>,

    /// Disable streaming (then TTFT equals E2E).
    #[arg(long)]
    pub no_stream: bool,

    /// Seed of the arrival process and the workload generator.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 300.0)]
    pub timeout_s: f64,

    /// Bearer token sent as `Authorization: Bearer ...` (never read from the environment, so
    /// a key is only sent where it is asked for).
    #[arg(long)]
    pub api_key: Option<String>,

    /// Do not draw a progress bar.
    #[arg(long)]
    pub no_progress: bool,

    /// Print no table (for callers that report the returned outcome themselves, such as
    /// `kvgate demo`); files asked for with --json and --plot are still written.
    #[arg(long)]
    pub quiet: bool,

    /// random: mean prompt length in tokens.
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: u32,

    /// random: mean output length in tokens.
    #[arg(long, default_value_t = 128)]
    pub random_output_len: u32,

    /// random: lengths are uniform in [len*(1-r), len*(1+r)].
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,

    /// prefix-repetition: shared prefix length in tokens.
    #[arg(long, default_value_t = 256)]
    pub prefix_repetition_prefix_len: u32,

    /// prefix-repetition: unique suffix length in tokens.
    #[arg(long, default_value_t = 256)]
    pub prefix_repetition_suffix_len: u32,

    /// prefix-repetition: number of distinct prefixes.
    #[arg(long, default_value_t = 10)]
    pub prefix_repetition_num_prefixes: u32,

    /// prefix-repetition: output length in tokens.
    #[arg(long, default_value_t = 128)]
    pub prefix_repetition_output_len: u32,

    /// agentic: number of tenants (each has its own system prompt and tool definitions).
    #[arg(long, default_value_t = 8)]
    pub agentic_tenants: u32,

    /// agentic: tokens of system prompt plus tool definitions per tenant.
    #[arg(long, default_value_t = 2000)]
    pub agentic_system_len: u32,

    /// agentic: mean turns per session (geometric); each turn resends the conversation.
    #[arg(long, default_value_t = 6.0)]
    pub agentic_turns: f64,

    /// agentic: mean tokens of each new user / tool-result message (lognormal).
    #[arg(long, default_value_t = 150.0)]
    pub agentic_user_len: f64,

    /// agentic: mean answer length in tokens (lognormal); the answer joins the conversation.
    #[arg(long, default_value_t = 250.0)]
    pub agentic_output_len: f64,

    /// agentic: mean think time between an answer and the next turn, milliseconds
    /// (exponential).
    #[arg(long, default_value_t = 5000.0)]
    pub agentic_think_time_ms: f64,

    /// agentic: parallel calls when a turn fans out (sub-agents sharing the conversation).
    #[arg(long, default_value_t = 4)]
    pub agentic_fan_out: u32,

    /// agentic: probability that a turn fans out.
    #[arg(long, default_value_t = 0.15)]
    pub agentic_fanout_prob: f64,

    /// agentic: a session ends once its context exceeds this many tokens.
    #[arg(long, default_value_t = 32_000)]
    pub agentic_max_context: u32,

    /// fanout: distinct shared system prompts.
    #[arg(long, default_value_t = 3)]
    pub fanout_prompts: u32,

    /// fanout: tokens of each shared prompt.
    #[arg(long, default_value_t = 4000)]
    pub fanout_prompt_len: u32,

    /// fanout: calls per burst, sent at once.
    #[arg(long, default_value_t = 16)]
    pub fanout_calls: u32,

    /// fanout: mean tokens of the parent's context shared by a burst's calls.
    #[arg(long, default_value_t = 1000.0)]
    pub fanout_context_len: f64,

    /// fanout: mean tokens of each call's own task text.
    #[arg(long, default_value_t = 300.0)]
    pub fanout_task_len: f64,
}
