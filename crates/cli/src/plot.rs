//! `kvgate plot`: time series from a JSON-lines file drawn with the bench's plotting, one panel
//! per numeric field against a time field (what `scripts/soak.sh` samples every 10 s).

use anyhow::Context;
use kvgate_bench::plot::{draw_series, Panel};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Flags of `kvgate plot`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// JSON lines, one object per sample.
    #[arg(long)]
    input: PathBuf,
    /// The picture (.svg or .png).
    #[arg(long)]
    out: PathBuf,
    /// The field holding seconds.
    #[arg(long, default_value = "t_s")]
    x: String,
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.input)
        .with_context(|| format!("reading {}", args.input.display()))?;
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let sample: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", args.input.display(), i + 1))?;
        let x = sample
            .get(&args.x)
            .and_then(serde_json::Value::as_f64)
            .with_context(|| format!("line {}: no number in {:?}", i + 1, args.x))?;
        for (key, value) in &sample {
            if let (true, Some(y)) = (key != &args.x, value.as_f64()) {
                series.entry(key.clone()).or_default().push((x, y));
            }
        }
    }
    anyhow::ensure!(!series.is_empty(), "no numeric field besides {:?}", args.x);
    let panels: Vec<Panel> = series
        .into_iter()
        .map(|(title, points)| Panel { title, points })
        .collect();
    draw_series(&args.out, &panels)?;
    Ok(())
}
