//! `kvgate route-eval`: how well the difficulty scorers rank public labelled data, in
//! RouteLLM's figures (APGR, CPT(50%); `kvgate_core::difficulty::eval` states the formulas),
//! on a held-out split, against random routing; and how close a threshold calibrated on the
//! training split holds its target strong share on the held-out rows.
//!
//! The split: rows are shuffled by a ChaCha8 generator seeded with `--split-seed`; the first
//! `--test-share` of them are held out, the rest are the training split. The kNN scorer's
//! labelled examples (label: only the strong model was right, RouteLLM's "strong wins") and
//! its hashed TF-IDF vocabulary are the training split; thresholds are calibrated on the
//! training split's scores, each training row scored by kNN without itself (leave-one-out:
//! otherwise every row would find itself as its nearest neighbour).

use anyhow::{bail, Context};
use kvgate_core::difficulty::eval::{evaluate, figures, Point, Report, Row};
use kvgate_core::difficulty::{
    threshold_for_share, HashedTfIdf, KnnScorer, RuleInput, RuleWeights,
};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use std::io::Write;
use std::path::PathBuf;

/// Flags of `kvgate route-eval`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// JSON lines with `prompt`, `weak` and `strong` (correctness) and optionally `source`
    /// (`test-data/routellm/routing-eval.jsonl`).
    #[arg(long)]
    data: PathBuf,
    /// Seed of the shuffle that draws the held-out split.
    #[arg(long, default_value_t = 1)]
    split_seed: u64,
    /// Share of rows held out.
    #[arg(long, default_value_t = 0.3)]
    test_share: f64,
    /// Neighbours that vote in the kNN scorer.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Hashed TF-IDF dimensions.
    #[arg(long, default_value_t = 4096)]
    dims: usize,
    /// Strong shares to calibrate thresholds for (comma-separated, each in 0..=1).
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.2, 0.5, 0.8])]
    targets: Vec<f64>,
    /// Runs of random routing averaged (RouteLLM averages 10).
    #[arg(long, default_value_t = 10)]
    random_iters: usize,
    /// A directory with a static embedding model (`embeddings.safetensors` and `tokenizer.json`,
    /// as `scripts/fetch-static-embedder.sh` writes): adds kNN over its embeddings.
    #[arg(long)]
    embedder_dir: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Deserialize)]
struct Labelled {
    prompt: String,
    weak: bool,
    strong: bool,
    #[serde(default)]
    source: String,
}

fn load(path: &PathBuf) -> anyhow::Result<Vec<Labelled>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let row: Labelled = serde_json::from_str(line).with_context(|| {
            format!(
                "{} line {}: needs prompt, weak and strong",
                path.display(),
                i + 1
            )
        })?;
        rows.push(row);
    }
    if rows.len() < 20 {
        bail!(
            "{}: {} rows; the split needs at least 20",
            path.display(),
            rows.len()
        );
    }
    Ok(rows)
}

/// The split, as indices into the rows.
struct Split {
    test: Vec<usize>,
    train: Vec<usize>,
}

fn split(n: usize, seed: u64, test_share: f64) -> Split {
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    let tests = ((n as f64 * test_share).round() as usize).clamp(1, n - 1);
    Split {
        test: order[..tests].to_vec(),
        train: order[tests..].to_vec(),
    }
}

/// Scores of every row by each scorer: rules, kNN over lexical vectors and, with
/// `--embedder-dir`, kNN over a static model's embeddings (training rows leave-one-out).
fn score_all(
    rows: &[Labelled],
    train: &[usize],
    args: &Args,
) -> anyhow::Result<Vec<(&'static str, Vec<f64>)>> {
    let rules = RuleWeights::default();
    let by_rules = rows
        .iter()
        .map(|r| {
            rules
                .score(RuleInput {
                    text: &r.prompt,
                    tools: false,
                })
                .p
        })
        .collect();
    let lexical = HashedTfIdf::fit(args.dims, train.iter().map(|&i| rows[i].prompt.as_str()))?;
    let vectors: Vec<Vec<f32>> = rows.iter().map(|r| lexical.vector(&r.prompt)).collect();
    let mut out = vec![
        ("rules", by_rules),
        ("knn", knn_scores(rows, train, &vectors, args.k)?),
    ];
    if let Some(dir) = &args.embedder_dir {
        let model = kvgate_gateway::semcache::StaticModel::load(dir)
            .with_context(|| format!("loading the static embedder in {}", dir.display()))?;
        let vectors: Vec<Vec<f32>> = rows.iter().map(|r| unit(model.embed(&r.prompt))).collect();
        out.push(("knn-emb", knn_scores(rows, train, &vectors, args.k)?));
    }
    Ok(out)
}

/// `v` scaled to unit length (a zero vector stays zero: it neighbours nothing).
fn unit(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// Every row's kNN score with the training rows (and their `vectors`) as the labelled
/// examples; a training row is scored without itself.
fn knn_scores(
    rows: &[Labelled],
    train: &[usize],
    vectors: &[Vec<f32>],
    k: usize,
) -> anyhow::Result<Vec<f64>> {
    let wins = |i: usize| rows[i].strong && !rows[i].weak;
    // Each training row's place among the examples (a zero vector has none).
    let mut place = vec![None; rows.len()];
    let mut labelled = Vec::with_capacity(train.len());
    for &i in train {
        if vectors[i].iter().any(|x| *x != 0.0) {
            place[i] = Some(labelled.len());
            labelled.push((vectors[i].clone(), f64::from(u8::from(wins(i)))));
        }
    }
    let knn = KnnScorer::new(k, labelled)?;
    // A row without neighbours gets the examples' base rate.
    let base = train.iter().filter(|&&i| wins(i)).count() as f64 / train.len() as f64;
    Ok(vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let score = match place[i] {
                Some(at) => knn.score_without(v, at),
                None => knn.score(v),
            };
            score.map_or(base, |s| s.p)
        })
        .collect())
}

fn rows_of(rows: &[Labelled], idx: &[usize], scores: &[f64]) -> Vec<Row> {
    idx.iter()
        .map(|&i| Row {
            score: scores[i],
            weak: rows[i].weak,
            strong: rows[i].strong,
        })
        .collect()
}

/// Random routing averaged over `iters` runs, point by point (RouteLLM seeds it with 0).
fn random(rows: &[Row], iters: usize) -> anyhow::Result<Report> {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut sum: Vec<Point> = Vec::new();
    let mut last = None;
    for _ in 0..iters.max(1) {
        let shuffled: Vec<Row> = rows
            .iter()
            .map(|r| Row {
                score: rng.random(),
                ..*r
            })
            .collect();
        let report = evaluate(&shuffled, 10)?;
        if sum.is_empty() {
            sum = vec![
                Point {
                    strong_pct: 0.0,
                    accuracy: 0.0
                };
                report.curve.len()
            ];
        }
        for (s, p) in sum.iter_mut().zip(&report.curve) {
            s.strong_pct += p.strong_pct;
            s.accuracy += p.accuracy;
        }
        last = Some(report);
    }
    let last = last.context("no random run")?;
    let n = iters.max(1) as f64;
    let curve = sum
        .into_iter()
        .map(|p| Point {
            strong_pct: p.strong_pct / n,
            accuracy: p.accuracy / n,
        })
        .collect();
    Ok(figures(curve, last.weak_accuracy, last.strong_accuracy))
}

fn subsets(rows: &[Labelled], test: &[usize]) -> Vec<(String, Vec<usize>)> {
    let mut names: Vec<String> = test
        .iter()
        .map(|&i| {
            rows[i]
                .source
                .split('/')
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .filter(|s| !s.is_empty())
        .collect();
    names.sort();
    names.dedup();
    let mut out = vec![("all".to_owned(), test.to_vec())];
    if names.len() > 1 {
        for name in names {
            let idx = test
                .iter()
                .copied()
                .filter(|&i| rows[i].source.split('/').next() == Some(name.as_str()))
                .collect();
            out.push((name, idx));
        }
    }
    out
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.digits$}"))
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    if !(0.0 < args.test_share && args.test_share < 1.0) {
        bail!(
            "--test-share must be within (0, 1), got {}",
            args.test_share
        );
    }
    if let Some(t) = args.targets.iter().find(|t| !(0.0..=1.0).contains(*t)) {
        bail!("--targets must be within 0..=1, got {t}");
    }
    let rows = load(&args.data)?;
    let s = split(rows.len(), args.split_seed, args.test_share);
    let scores = score_all(&rows, &s.train, args)?;
    let mut results = Vec::new();
    for (subset, idx) in subsets(&rows, &s.test) {
        let mut reports: Vec<(&str, Report)> = Vec::new();
        for (name, sc) in &scores {
            reports.push((name, evaluate(&rows_of(&rows, &idx, sc), 10)?));
        }
        reports.push((
            "random",
            random(&rows_of(&rows, &idx, &scores[0].1), args.random_iters)?,
        ));
        for (scorer, r) in reports {
            results.push(serde_json::json!({
                "subset": subset, "rows": idx.len(), "scorer": scorer,
                "weak_accuracy": r.weak_accuracy, "strong_accuracy": r.strong_accuracy,
                "auc": r.auc, "apgr": r.apgr, "cpt50": r.cpt50,
            }));
        }
    }
    let mut calibration = Vec::new();
    for (name, sc) in &scores {
        let train: Vec<f64> = s.train.iter().map(|&i| sc[i]).collect();
        for &target in &args.targets {
            let threshold = threshold_for_share(&train, target)?;
            let strong = s.test.iter().filter(|&&i| sc[i] >= threshold).count();
            calibration.push(serde_json::json!({
                "scorer": name, "target": target, "threshold": threshold,
                "realised": strong as f64 / s.test.len() as f64,
            }));
        }
    }
    let split = serde_json::json!({
        "seed": args.split_seed, "test_share": args.test_share, "rows": rows.len(),
        "test": s.test.len(), "train": s.train.len(),
        "k": args.k, "dims": args.dims,
    });
    if args.json {
        let out =
            serde_json::json!({"split": split, "results": results, "calibration": calibration});
        let mut stdout = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut stdout, &out)?;
        writeln!(stdout)?;
        return Ok(());
    }
    print_tables(&split, &results, &calibration)?;
    Ok(())
}

fn print_tables(
    split: &serde_json::Value,
    results: &[serde_json::Value],
    calibration: &[serde_json::Value],
) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "held out {} of {} rows (seed {}, share {}); kNN (k {}, {} dims) and thresholds from the other {}",
        split["test"], split["rows"], split["seed"], split["test_share"], split["k"], split["dims"],
        split["train"]
    )?;
    writeln!(
        out,
        "{:<8} {:>5} {:>6} {:>8} {:<7} {:>6} {:>9}",
        "subset", "rows", "weak%", "strong%", "scorer", "APGR", "CPT(50%)"
    )?;
    for r in results {
        writeln!(
            out,
            "{:<8} {:>5} {:>6.1} {:>8.1} {:<7} {:>6} {:>8}%",
            r["subset"].as_str().unwrap_or_default(),
            r["rows"],
            r["weak_accuracy"].as_f64().unwrap_or(f64::NAN),
            r["strong_accuracy"].as_f64().unwrap_or(f64::NAN),
            r["scorer"].as_str().unwrap_or_default(),
            opt(r["apgr"].as_f64(), 3),
            opt(r["cpt50"].as_f64(), 1),
        )?;
    }
    writeln!(
        out,
        "{:<7} {:>6} {:>9} {:>9}",
        "scorer", "target", "threshold", "realised"
    )?;
    for c in calibration {
        writeln!(
            out,
            "{:<7} {:>6.2} {:>9.4} {:>9.3}",
            c["scorer"].as_str().unwrap_or_default(),
            c["target"].as_f64().unwrap_or(f64::NAN),
            c["threshold"].as_f64().unwrap_or(f64::NAN),
            c["realised"].as_f64().unwrap_or(f64::NAN),
        )?;
    }
    Ok(())
}
