//! What a run sends, read from the arguments: an open-loop workload (random, prefix
//! repetition, a replayed file) or one of the simulator's closed-loop models.

use crate::workload::{Kind, PrefixConfig, RandomConfig, Workload};
use crate::{BenchArgs, BenchError};
use kvgate_sim::dist::Lengths;
use kvgate_sim::workload::{Agentic, AgenticConfig, Bursts, BurstsConfig};
use std::path::Path;

/// A closed-loop workload: the simulator's model at an offered rate.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Closed {
    Agentic(AgenticConfig),
    Fanout(BurstsConfig),
}

impl Closed {
    pub(crate) fn at(self, rate: f64) -> Box<dyn kvgate_sim::workload::Workload + Send> {
        match self {
            Closed::Agentic(c) => Box::new(Agentic::new(AgenticConfig {
                session_rate: rate,
                ..c
            })),
            Closed::Fanout(c) => Box::new(Bursts::new(BurstsConfig { rate, ..c })),
        }
    }

    /// Requests per started session or burst, roughly (for the progress bar).
    pub(crate) fn per_unit(self) -> f64 {
        match self {
            Closed::Agentic(c) => c.turns * (1.0 + c.fanout_prob * f64::from(c.fanout)),
            Closed::Fanout(c) => f64::from(c.fanout.max(1)),
        }
    }
}

/// What the run sends.
#[derive(Debug, Clone)]
pub(crate) enum Plan {
    Open(Kind),
    Closed(Closed),
}

fn mean(base: Lengths, mean: f64) -> Lengths {
    base.with_mean(mean.max(1.0))
}

pub(crate) fn plan(args: &BenchArgs) -> Result<Plan, BenchError> {
    match args.workload.as_str() {
        "agentic" => {
            let d = AgenticConfig::default();
            return Ok(Plan::Closed(Closed::Agentic(AgenticConfig {
                requests: u64::MAX,
                tenants: args.agentic_tenants.max(1),
                system_tokens: args.agentic_system_len,
                turns: args.agentic_turns.max(1.0),
                user_text: mean(d.user_text, args.agentic_user_len),
                answer: mean(d.answer, args.agentic_output_len),
                think_time_s: args.agentic_think_time_ms.max(0.0) / 1e3,
                fanout_prob: args.agentic_fanout_prob.clamp(0.0, 1.0),
                fanout: args.agentic_fan_out,
                max_context: args.agentic_max_context,
                ..d
            })));
        }
        "fanout" => {
            let d = BurstsConfig::default();
            return Ok(Plan::Closed(Closed::Fanout(BurstsConfig {
                requests: u64::MAX,
                prompts: args.fanout_prompts.max(1),
                prompt_tokens: args.fanout_prompt_len,
                fanout: args.fanout_calls.max(1),
                context: mean(d.context, args.fanout_context_len),
                task: mean(d.task, args.fanout_task_len),
                ..d
            })));
        }
        _ => {}
    }
    workload_kind(args).map(Plan::Open)
}

fn workload_kind(args: &BenchArgs) -> Result<Kind, BenchError> {
    Ok(match args.workload.as_str() {
        "random" => Kind::Random(RandomConfig {
            input_len: args.random_input_len,
            output_len: args.random_output_len,
            range_ratio: args.random_range_ratio.clamp(0.0, 1.0),
        }),
        "prefix-repetition" | "prefix_repetition" => Kind::PrefixRepetition(PrefixConfig {
            prefix_len: args.prefix_repetition_prefix_len,
            suffix_len: args.prefix_repetition_suffix_len,
            num_prefixes: args.prefix_repetition_num_prefixes,
            output_len: args.prefix_repetition_output_len,
        }),
        file => Kind::Replay(Workload::load_jsonl(Path::new(file))?),
    })
}
