//! `kvgate config check FILE` and `kvgate serve --check`: what a configuration means before it
//! runs. The file is parsed and checked as `kvgate serve` would (unknown keys, every rule, the
//! TLS files, CA files and tokenizers it names), then printed whole with every default filled
//! in and its secrets masked, so an operator sees the values the gateway would use.

use anyhow::Context;
use kvgate_gateway::{Config, Gateway};
use std::path::PathBuf;

/// `kvgate config`: subcommands on a configuration file.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Check a configuration file as `kvgate serve` would, and print it with every default.
    Check(CheckArgs),
}

/// `kvgate config check`.
#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// The YAML file.
    file: PathBuf,
    /// Say only whether it is valid (no effective configuration on stdout).
    #[arg(long, short)]
    quiet: bool,
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    match &args.command {
        Command::Check(check) => {
            let text = std::fs::read_to_string(&check.file)
                .with_context(|| format!("reading {}", check.file.display()))?;
            let config = Config::from_yaml(&text).with_context(|| {
                format!("{} is not a valid configuration", check.file.display())
            })?;
            report(&config, &check.file.display().to_string(), check.quiet)
        }
    }
}

/// Checks `config` (from `source`) as the gateway would and prints it; an error names what
/// is wrong.
pub(crate) fn report(config: &Config, source: &str, quiet: bool) -> anyhow::Result<()> {
    Gateway::check(config).with_context(|| format!("{source} is not a valid configuration"))?;
    if !quiet {
        print!("{}", effective(config)?);
    }
    eprintln!("{source}: valid");
    for note in notes(config) {
        eprintln!("note: {note}");
    }
    Ok(())
}

/// The configuration as YAML with every default, the admin token and the endpoints' API keys
/// masked.
fn effective(config: &Config) -> anyhow::Result<String> {
    let mut tree = serde_json::to_value(config).context("serializing the configuration")?;
    mask(&mut tree);
    yaml_serde::to_string(&tree).context("writing the configuration as YAML")
}

/// Keys whose values are secrets.
const SECRETS: [&str; 2] = ["admin_token", "api_key"];

fn mask(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if SECRETS.contains(&key.as_str()) && !v.is_null() {
                    *v = serde_json::Value::String("<masked>".into());
                } else {
                    mask(v);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(mask),
        _ => {}
    }
}

/// What a valid configuration does that its author may not expect.
fn notes(config: &Config) -> Vec<String> {
    let mut notes = Vec::new();
    if config.endpoints.is_empty() && config.discovery.inference_pool.is_none() {
        notes.push(
            "no endpoints and no discovery: `kvgate serve` starts emulated engines in-process"
                .to_string(),
        );
    }
    if config.admin_token.is_none() {
        notes.push("no admin_token: the admin API and /ui are off".to_string());
    }
    let https_without_ca = config
        .endpoints
        .iter()
        .filter(|e| e.url.starts_with("https://") && e.ca_file.is_none())
        .count();
    if https_without_ca > 0 {
        notes.push(format!(
            "{https_without_ca} https endpoint(s) without ca_file: their certificates must chain \
             to this machine's system CAs"
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_at_any_depth_and_nulls_stay_null() {
        let mut tree = serde_json::json!({
            "admin_token": "s3cret",
            "endpoints": [{"url": "http://a", "api_key": "sk-1"}, {"url": "http://b", "api_key": null}],
        });
        mask(&mut tree);
        assert_eq!(
            tree,
            serde_json::json!({
                "admin_token": "<masked>",
                "endpoints": [{"url": "http://a", "api_key": "<masked>"},
                              {"url": "http://b", "api_key": null}],
            })
        );
    }

    #[test]
    fn the_effective_configuration_reads_back_as_the_same_configuration() {
        let config = Config::from_yaml("endpoints: [{url: 'http://10.0.0.1:8000'}]\n").unwrap();
        let text = effective(&config).unwrap();
        assert!(
            text.contains("scrape:") && text.contains("interval_ms: 500"),
            "{text}"
        );
        assert_eq!(Config::from_yaml(&text).unwrap(), config);
    }
}
