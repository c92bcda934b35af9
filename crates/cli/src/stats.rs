//! `kvgate stats`: count, mean, percentiles and max of a column of numbers, by the one
//! definition the bench and the simulator use (`kvgate_core::stats`, NumPy's linear
//! interpolation), so scripts summarise access logs and their own series without computing
//! percentiles of their own.

use anyhow::Context;
use kvgate_core::stats::{percentile, summary};
use std::io::Read;
use std::path::PathBuf;

/// Flags of `kvgate stats`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// JSON lines (one object per line) or one number per line; `-` or nothing reads stdin.
    input: Option<PathBuf>,
    /// The field holding the number (JSON lines); a line without it is skipped.
    #[arg(long)]
    field: Option<String>,
    /// Only lines whose `KEY` is `VALUE` (compared as text; repeatable, all must hold).
    #[arg(long = "where", value_name = "KEY=VALUE")]
    filters: Vec<String>,
    /// Also the share of values within `LO..=HI`, as `LO,HI`.
    #[arg(long, value_name = "LO,HI")]
    within: Option<String>,
    /// Further percentiles to report (0-100, comma-separated).
    #[arg(long, value_delimiter = ',')]
    percentiles: Vec<f64>,
    /// Print JSON instead of one line of text.
    #[arg(long)]
    json: bool,
}

fn read(input: Option<&PathBuf>) -> anyhow::Result<String> {
    let mut text = String::new();
    match input.filter(|p| p.as_os_str() != "-") {
        Some(path) => {
            text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
        }
        None => {
            std::io::stdin().read_to_string(&mut text)?;
        }
    }
    Ok(text)
}

/// The numbers of `text` that pass `filters`.
fn values(
    text: &str,
    field: Option<&str>,
    filters: &[(String, String)],
) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let value = match field {
            None if filters.is_empty() => line
                .trim()
                .parse::<f64>()
                .with_context(|| format!("line {}: not a number: {line:?}", i + 1))?,
            _ => {
                let row: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line)
                    .with_context(|| format!("line {}: not a JSON object", i + 1))?;
                let text_of = |v: &serde_json::Value| match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                if !filters
                    .iter()
                    .all(|(k, want)| row.get(k).is_some_and(|v| text_of(v) == *want))
                {
                    continue;
                }
                let name = field.context("--where needs --field")?;
                match row.get(name).and_then(serde_json::Value::as_f64) {
                    Some(v) => v,
                    None => continue,
                }
            }
        };
        anyhow::ensure!(!value.is_nan(), "line {}: NaN", i + 1);
        out.push(value);
    }
    Ok(out)
}

fn parse_filters(filters: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    filters
        .iter()
        .map(|f| {
            f.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .with_context(|| format!("--where {f:?}: expected KEY=VALUE"))
        })
        .collect()
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let filters = parse_filters(&args.filters)?;
    let mut values = values(&read(args.input.as_ref())?, args.field.as_deref(), &filters)?;
    let within = match &args.within {
        None => None,
        Some(range) => {
            let (lo, hi) = range
                .split_once(',')
                .and_then(|(lo, hi)| {
                    Some((
                        lo.trim().parse::<f64>().ok()?,
                        hi.trim().parse::<f64>().ok()?,
                    ))
                })
                .with_context(|| format!("--within {range:?}: expected LO,HI"))?;
            let inside = values.iter().filter(|v| (lo..=hi).contains(*v)).count();
            Some((!values.is_empty()).then(|| inside as f64 / values.len() as f64))
        }
    };
    for p in &args.percentiles {
        anyhow::ensure!(
            (0.0..=100.0).contains(p),
            "--percentiles {p}: must be within 0..=100"
        );
    }
    let s = summary(&mut values);
    let extra: Vec<(f64, Option<f64>)> = args
        .percentiles
        .iter()
        .map(|&p| (p, percentile(&values, p / 100.0)))
        .collect();
    if args.json {
        let mut out = serde_json::to_value(s)?;
        for (p, v) in &extra {
            out[format!("p{p}")] = serde_json::json!(v);
        }
        if let Some(share) = within {
            out["within"] = serde_json::json!(share);
        }
        println!("{out}");
        return Ok(());
    }
    let show = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
    let mut line = format!(
        "n {} mean {} p50 {} p90 {} p95 {} p99 {} max {}",
        s.count,
        show(s.mean),
        show(s.p50),
        show(s.p90),
        show(s.p95),
        show(s.p99),
        show(s.max)
    );
    for (p, v) in extra {
        line.push_str(&format!(" p{p} {}", show(v)));
    }
    if let Some(share) = within {
        line.push_str(&format!(" within {}", show(share)));
    }
    println!("{line}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_numbers_and_filtered_fields() {
        assert_eq!(
            values("1\n2\n\n3\n", None, &[]).unwrap(),
            vec![1.0, 2.0, 3.0]
        );
        let log = r#"{"tenant":"light","queue_ms":4}
{"tenant":"heavy","queue_ms":9}
{"tenant":"light"}
{"tenant":"light","queue_ms":6.5}"#;
        let light = [("tenant".to_owned(), "light".to_owned())];
        assert_eq!(
            values(log, Some("queue_ms"), &light).unwrap(),
            vec![4.0, 6.5]
        );
        assert!(values("x\n", None, &[]).is_err());
        assert!(values(log, None, &light).is_err(), "a filter needs a field");
    }
}
