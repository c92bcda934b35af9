//! `kvgate policies`: the catalogue of routing policies, parameters and defaults.

use anyhow::Context;
use kvgate_core::PolicyConfig;
use serde_json::{json, Map, Value};
use std::io::Write;

/// Flags of `kvgate policies`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// One policy as listed: name, summary, and each parameter with its default and meaning.
fn catalogue() -> anyhow::Result<Vec<Value>> {
    PolicyConfig::NAMES
        .iter()
        .map(|name| {
            let config = PolicyConfig::default_for(name).context("unknown policy in catalogue")?;
            let doc = config.doc();
            let mut defaults = match serde_json::to_value(&config)? {
                Value::Object(map) => map,
                _ => Map::new(),
            };
            defaults.remove("name");
            let params: Vec<Value> = doc
                .params
                .iter()
                .map(|(param, about)| {
                    json!({
                        "name": param,
                        "default": defaults.get(*param).cloned().unwrap_or(Value::Null),
                        "about": about,
                    })
                })
                .collect();
            Ok(json!({ "name": doc.name, "summary": doc.summary, "parameters": params }))
        })
        .collect()
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let policies = catalogue()?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &json!({ "policies": policies }))?;
        writeln!(out)?;
        return Ok(());
    }
    for p in &policies {
        writeln!(
            out,
            "{}\n  {}",
            p["name"].as_str().unwrap_or(""),
            p["summary"].as_str().unwrap_or("")
        )?;
        for param in p["parameters"].as_array().into_iter().flatten() {
            let name = param["name"].as_str().unwrap_or("");
            let about = param["about"].as_str().unwrap_or("");
            match &param["default"] {
                Value::Object(nested) => {
                    writeln!(out, "    {name:<36} {:<14} {about}", "")?;
                    for (key, value) in nested {
                        writeln!(out, "      {:<34} {value}", format!("{name}.{key}"))?;
                    }
                }
                value => writeln!(out, "    {name:<36} {:<14} {about}", value.to_string())?,
            }
        }
        writeln!(out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_lists_every_policy_with_defaults() {
        let c = catalogue().unwrap();
        let names: Vec<&str> = c.iter().map(|p| p["name"].as_str().unwrap()).collect();
        assert_eq!(names, PolicyConfig::NAMES);
        let cache_aware = &c[8]["parameters"];
        let threshold = cache_aware
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "cache_threshold")
            .unwrap();
        assert_eq!(threshold["default"], json!(0.3));
        for p in &c {
            for param in p["parameters"].as_array().unwrap() {
                assert!(
                    !param["default"].is_null(),
                    "{} {} has no default",
                    p["name"],
                    param["name"]
                );
            }
        }
    }
}
