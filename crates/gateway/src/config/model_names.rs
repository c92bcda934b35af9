//! Model groups as a whole: the names endpoints answer to (their `model` and `served_as`
//! aliases), checked across endpoints and against every other section that names a model, so
//! a group that cannot work fails at load (or a reload keeps the running configuration).

use super::Config;
use crate::error::ConfigError;
use std::collections::{BTreeMap, BTreeSet};

/// Checks the names of `config`:
/// - aliases must not form a cycle across endpoints (`a` served as `b` on one endpoint while
///   `b` is served as `a` on another swaps the names: a request for either reaches both
///   models);
/// - when every endpoint declares its `model` (nothing left to discover at run time), each
///   model named by `tenancy.keys[].models`, `tenancy.prices` and `tokenizers` must be served
///   by some endpoint, as its model or an alias, or be a routed name (`routing.models`).
pub(crate) fn check(config: &Config) -> Result<(), ConfigError> {
    let mut renames: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for e in &config.endpoints {
        if let Some(model) = e.model.as_deref() {
            for alias in &e.served_as {
                renames.entry(alias.as_str()).or_default().insert(model);
            }
        }
    }
    if let Some(cycle) = find_cycle(&renames) {
        return Err(ConfigError::Invalid {
            field: "endpoints[].served_as".into(),
            why: format!(
                "aliases form a cycle ({}): each name would reach the other's model",
                cycle.join(" -> ")
            ),
        });
    }
    let declared =
        !config.endpoints.is_empty() && config.endpoints.iter().all(|e| e.model.is_some());
    if !declared {
        return Ok(());
    }
    let served: BTreeSet<&str> = config
        .endpoints
        .iter()
        .flat_map(|e| e.model.iter().chain(&e.served_as))
        .chain(config.routing.models.keys())
        .map(String::as_str)
        .collect();
    let unknown = |field: String, name: &str| ConfigError::Invalid {
        field,
        why: format!(
            "names model {name:?}, which no endpoint serves (served: {})",
            served.iter().copied().collect::<Vec<_>>().join(", ")
        ),
    };
    for (i, key) in config.tenancy.keys.iter().enumerate() {
        for m in key.models.iter().flatten() {
            if !served.contains(m.as_str()) {
                return Err(unknown(format!("tenancy.keys[{i}].models"), m));
            }
        }
    }
    for m in config.tenancy.prices.keys() {
        if !served.contains(m.as_str()) {
            return Err(unknown(format!("tenancy.prices.{m}"), m));
        }
    }
    for m in config.tokenizers.keys().filter(|m| *m != "*") {
        if !served.contains(m.as_str()) {
            return Err(unknown(format!("tokenizers.{m}"), m));
        }
    }
    Ok(())
}

/// Every model name the endpoints declare (models and aliases), or none when some endpoint
/// leaves its model to discovery (or there are no endpoints yet).
pub(crate) fn declared(config: &Config) -> Vec<&str> {
    if config.endpoints.is_empty() || config.endpoints.iter().any(|e| e.model.is_none()) {
        return Vec::new();
    }
    let names: BTreeSet<&str> = config
        .endpoints
        .iter()
        .flat_map(|e| e.model.iter().chain(&e.served_as))
        .map(String::as_str)
        .collect();
    names.into_iter().collect()
}

/// A cycle among alias -> model renames, as the names along it, if there is one.
fn find_cycle<'a>(renames: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Option<Vec<&'a str>> {
    fn visit<'a>(
        name: &'a str,
        renames: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<&'a str>> {
        if let Some(at) = path.iter().position(|n| *n == name) {
            let mut cycle = path[at..].to_vec();
            cycle.push(name);
            return Some(cycle);
        }
        if !done.insert(name) {
            return None;
        }
        path.push(name);
        for next in renames.get(name).into_iter().flatten() {
            if let Some(cycle) = visit(next, renames, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    renames
        .keys()
        .find_map(|start| visit(start, renames, &mut Vec::new(), &mut done))
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn error(yaml: &str) -> String {
        Config::from_yaml(yaml).unwrap_err().to_string()
    }

    #[test]
    fn alias_cycles_and_unknown_model_names_fail_at_load() {
        let swapped = r#"
endpoints:
  - {url: "http://a:1", model: x, served_as: [y]}
  - {url: "http://b:1", model: y, served_as: [x]}
"#;
        let e = error(swapped);
        assert!(e.contains("cycle (x -> y -> x)"), "{e}");
        let three = r#"
endpoints:
  - {url: "http://a:1", model: b, served_as: [a]}
  - {url: "http://b:1", model: c, served_as: [b]}
  - {url: "http://c:1", model: a, served_as: [c]}
"#;
        assert!(
            error(three).contains("a -> b -> c -> a"),
            "{}",
            error(three)
        );
        let group = "endpoints:\n  - {url: \"http://a:1\", model: llama, served_as: [chat]}\n  - {url: \"https://h\", model: gpt, served_as: [chat]}\n";
        Config::from_yaml(group).unwrap();
        let e = error(&format!(
            "{group}tenancy: {{prices: {{chta: {{input_per_mtok: 1, output_per_mtok: 1}}}}}}\n"
        ));
        assert!(
            e.contains("tenancy.prices.chta") && e.contains("served: chat, gpt, llama"),
            "{e}"
        );
        let e = error(&format!("{group}tokenizers: {{lama: /tmp}}\n"));
        assert!(e.contains("tokenizers.lama"), "{e}");
        let key = "tenancy: {keys: [{name: k, key_sha256: \"0000000000000000000000000000000000000000000000000000000000000000\", models: [chat, gtp]}]}\n";
        let e = error(&format!("{group}{key}"));
        assert!(
            e.contains("tenancy.keys[0].models") && e.contains("\"gtp\""),
            "{e}"
        );
        // A model discovered at run time may be any name: nothing to check against.
        let discovered = "endpoints:\n  - {url: \"http://a:1\"}\ntokenizers: {lama: /tmp}\n";
        assert!(!Config::from_yaml(discovered)
            .is_err_and(|e| e.to_string().contains("no endpoint serves")));
    }
}
