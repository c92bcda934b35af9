//! Measures the semantic cache's guards on perturbed pairs with a static embedding model:
//! per kind of pair (paraphrase, numbers changed, negation added, word order swapped), the
//! similarity range, how many pairs the threshold alone lets through, and how many of those
//! each guard stops.
//!
//! ```text
//! scripts/fetch-static-embedder.sh /tmp/wordllama
//! cargo run --release -p kvgate-gateway --example semcache_guards -- /tmp/wordllama \
//!     test-data/semcache/pairs.jsonl 0.9
//! ```

use kvgate_core::semcache::guards::{self, Guard, Guards};
use kvgate_gateway::semcache::StaticModel;
use std::collections::BTreeMap;

#[derive(Default)]
struct Row {
    similarities: Vec<f32>,
    through: usize,
    stopped: BTreeMap<Guard, usize>,
    /// Pairs over the threshold that a guard stopped: `(guard, a, b)`.
    examples: Vec<(Guard, String, String)>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: semcache_guards MODEL_DIR PAIRS.jsonl [THRESHOLD]";
    let dir = args.next().ok_or(usage)?;
    let pairs = args.next().ok_or(usage)?;
    let threshold: f32 = args.next().map_or(Ok(0.9), |t| t.parse())?;
    let model = StaticModel::load(std::path::Path::new(&dir))?;
    let unit = |text: &str| {
        let v = model.embed(text);
        let norm = v
            .iter()
            .map(|x| x * x)
            .sum::<f32>()
            .sqrt()
            .max(f32::MIN_POSITIVE);
        v.into_iter().map(|x| x / norm).collect::<Vec<f32>>()
    };
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    let mut kinds = Vec::new();
    for line in std::fs::read_to_string(&pairs)?.lines() {
        let pair: serde_json::Value = serde_json::from_str(line)?;
        let field = |k: &str| {
            pair[k]
                .as_str()
                .map(str::to_owned)
                .ok_or("a pair needs kind, a, b")
        };
        let (kind, a, b) = (field("kind")?, field("a")?, field("b")?);
        if !kinds.contains(&kind) {
            kinds.push(kind.clone());
        }
        let similarity: f32 = unit(&a).iter().zip(unit(&b)).map(|(x, y)| x * y).sum();
        let row = rows.entry(kind).or_default();
        row.similarities.push(similarity);
        if similarity >= threshold {
            row.through += 1;
            if let Err(guard) = guards::check(&a, &b, Guards::default()) {
                *row.stopped.entry(guard).or_default() += 1;
                row.examples.push((guard, a.clone(), b.clone()));
            }
        }
    }
    println!("{} dimensions, threshold {threshold}\n", model.dim());
    println!("| pairs | n | similarity (min / median / max) | over the threshold | stopped by numbers / negation / order | served |");
    println!("|---|---|---|---|---|---|");
    for kind in kinds {
        let row = &rows[&kind];
        let mut s = row.similarities.clone();
        s.sort_by(f32::total_cmp);
        let stopped = |g| row.stopped.get(&g).copied().unwrap_or(0);
        let all: usize = row.stopped.values().sum();
        println!(
            "| {kind} | {} | {:.3} / {:.3} / {:.3} | {} | {} / {} / {} | {} |",
            s.len(),
            s[0],
            s[s.len() / 2],
            s[s.len() - 1],
            row.through,
            stopped(Guard::Numbers),
            stopped(Guard::Negation),
            stopped(Guard::Order),
            row.through - all,
        );
    }
    println!("\nParaphrases a guard stopped:");
    for (guard, a, b) in rows.get("paraphrase").map_or(&[][..], |r| &r.examples[..]) {
        println!("- {}: \"{a}\" / \"{b}\"", guard.name());
    }
    Ok(())
}
