//! `kvgate engine`: run one emulated vLLM-compatible engine.

use anyhow::Context;
use kvgate_engine::{BatchingMode, CostModel, EngineConfig, Fault};

/// Flags of `kvgate engine`; defaults resemble a mid-size model on one GPU.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Address to listen on (HOST:PORT; port 0 picks a free one and prints it).
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: String,
    /// Engine name (shown in the `x-kvgate-engine` response header).
    #[arg(long, default_value = "engine-0")]
    id: String,
    /// Served model name.
    #[arg(long, default_value = "kvgate-emulated")]
    model: String,
    /// KV blocks in the pool (vLLM num_gpu_blocks).
    #[arg(long, default_value_t = EngineConfig::default().kv_blocks)]
    kv_blocks: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = EngineConfig::default().block_size)]
    block_size: usize,
    /// Batch slots (vLLM --max-num-seqs).
    #[arg(long, default_value_t = EngineConfig::default().max_num_seqs)]
    max_num_seqs: usize,
    /// Token budget per iteration with chunked prefill (vLLM --max-num-batched-tokens).
    #[arg(long, default_value_t = EngineConfig::default().max_num_batched_tokens)]
    max_num_batched_tokens: usize,
    /// Batching mode: chunked (chunked prefill, vLLM's default), continuous or static.
    #[arg(long, default_value = "chunked")]
    batching: BatchingMode,
    /// Fixed time per engine iteration, ms (weights read once, launches, scheduling).
    #[arg(long, default_value_t = CostModel::default().step_overhead_ns / 1e6)]
    step_overhead_ms: f64,
    /// Time per uncached prompt token prefilled, µs.
    #[arg(long, default_value_t = CostModel::default().prefill_token_ns / 1e3)]
    prefill_token_us: f64,
    /// Time per sequence decoding one token in an iteration, µs.
    #[arg(long, default_value_t = CostModel::default().decode_seq_ns / 1e3)]
    decode_seq_us: f64,
    /// Time per context token attended by decoding sequences (KV reads), ns.
    #[arg(long, default_value_t = CostModel::default().context_token_ns)]
    context_token_ns: f64,
    /// Longest prompt plus output accepted (vLLM --max-model-len).
    #[arg(long, default_value_t = EngineConfig::default().max_model_len)]
    max_model_len: usize,
    /// Disable the prefix cache (vLLM --no-enable-prefix-caching).
    #[arg(long)]
    no_prefix_caching: bool,
    /// Real seconds per modelled second; 0 runs without delays.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Mean output length in tokens when a request does not set ignore_eos.
    #[arg(long, default_value_t = EngineConfig::default().mean_output_tokens)]
    mean_output_tokens: u32,
    /// Seed for output lengths, text and fault draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Publish KV events on this ZMQ endpoint (`tcp://*:5557` binds, `tcp://HOST:PORT` connects).
    #[arg(long)]
    kv_events: Option<String>,
    /// Topic frame of KV-event messages.
    #[arg(long, default_value = "kv-events")]
    kv_events_topic: String,
    /// Tokenize prompts with this model directory's `tokenizer.json` and chat template (as
    /// vLLM would), instead of the built-in stand-in.
    #[arg(long, value_name = "DIR")]
    tokenizer: Option<std::path::PathBuf>,
    /// A fault active from startup (repeatable), e.g. `429:retry_after=2,p=0.1`; see the README.
    #[arg(long = "fault", value_name = "SPEC")]
    faults: Vec<Fault>,
    /// Bearer token required by /admin/*; without it /admin/* is loopback-only.
    #[arg(long, env = "KVGATE_ENGINE_ADMIN_TOKEN")]
    admin_token: Option<String>,
    /// Worker threads of the async runtime (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Which legs of disaggregated requests it serves: prefill, decode or both.
    #[arg(long, default_value = "both")]
    role: kvgate_engine::Role,
    /// KV link bandwidth to decode engines, gigabytes per second.
    #[arg(long, default_value_t = EngineConfig::default().kv_bandwidth_gbps)]
    kv_bandwidth_gbps: f64,
    /// Fixed time per KV transfer, milliseconds.
    #[arg(long, default_value_t = EngineConfig::default().kv_transfer_setup_ms)]
    kv_transfer_setup_ms: f64,
    /// KV bytes per token.
    #[arg(long, default_value_t = EngineConfig::default().kv_bytes_per_token)]
    kv_bytes_per_token: u64,
    /// Seconds a prefill holds KV that no decode engine has read.
    #[arg(long, default_value_t = EngineConfig::default().kv_lease_secs)]
    kv_lease_secs: f64,
    #[command(flatten)]
    lora: LoraArgs,
}

/// LoRA adapters, with vLLM's flag names.
#[derive(Debug, clap::Args)]
struct LoraArgs {
    /// Serve LoRA adapters (implied by --lora-modules); others can be loaded at runtime
    /// through POST /v1/load_lora_adapter.
    #[arg(long)]
    enable_lora: bool,
    /// Adapters served from startup, `name=path` or a bare name (a request whose `model` is
    /// the name, or `BASE:name`, uses it).
    #[arg(long, num_args = 1.., value_name = "NAME[=PATH]")]
    lora_modules: Vec<String>,
    /// Distinct adapters one batch may hold; a request for another waits.
    #[arg(long, default_value_t = 1)]
    max_loras: usize,
    /// Adapters kept in memory (default: --max-loras); loading one that is not costs
    /// --lora-load-ms.
    #[arg(long)]
    max_cpu_loras: Option<usize>,
    /// Engine milliseconds to load an adapter that is not in memory.
    #[arg(long, default_value_t = kvgate_engine::LoraSettings::default().load_ms)]
    lora_load_ms: f64,
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let config = EngineConfig {
        id: args.id.clone(),
        model: args.model.clone(),
        kv_blocks: args.kv_blocks,
        block_size: args.block_size,
        max_num_seqs: args.max_num_seqs,
        max_num_batched_tokens: args.max_num_batched_tokens,
        batching: args.batching,
        cost: CostModel {
            step_overhead_ns: args.step_overhead_ms * 1e6,
            prefill_token_ns: args.prefill_token_us * 1e3,
            decode_seq_ns: args.decode_seq_us * 1e3,
            context_token_ns: args.context_token_ns,
            quantum_ns: 0,
        },
        max_model_len: args.max_model_len,
        prefix_caching: !args.no_prefix_caching,
        time_scale: args.time_scale,
        mean_output_tokens: args.mean_output_tokens,
        seed: args.seed,
        kv_events: args.kv_events.clone(),
        kv_events_topic: args.kv_events_topic.clone(),
        tokenizer: args.tokenizer.clone(),
        faults: args.faults.clone(),
        admin_token: args.admin_token.clone(),
        lora: kvgate_engine::LoraSettings {
            enable: args.lora.enable_lora,
            modules: args.lora.lora_modules.clone(),
            max_loras: args.lora.max_loras,
            max_cpu_loras: args.lora.max_cpu_loras,
            load_ms: args.lora.lora_load_ms,
        },
        role: args.role,
        kv_bandwidth_gbps: args.kv_bandwidth_gbps,
        kv_transfer_setup_ms: args.kv_transfer_setup_ms,
        kv_bytes_per_token: args.kv_bytes_per_token,
        kv_lease_secs: args.kv_lease_secs,
        ..EngineConfig::default()
    };
    config.validate()?;
    let runtime = crate::runtime(args.threads)?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        let addr = listener.local_addr()?;
        let engine = kvgate_engine::spawn(config, listener).await?;
        // One parseable line for scripts and tests that listen on port 0.
        println!("kvgate engine {} listening on http://{addr}", args.id);
        let token = engine.shutdown_token();
        tokio::spawn(async move {
            wait_for_signal().await;
            token.cancel();
        });
        engine.join().await?;
        Ok(())
    })
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
