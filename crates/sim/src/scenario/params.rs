//! `--set key=value` handling: typed reads with defaults, an echo of every parameter's effective
//! value for the report, and an error for keys no scenario reads.
//!
//! Keys of the form `<policy>.<field>[.<field>...]` override a policy's configuration (for
//! example `cache_aware.balance_abs_threshold=4` or
//! `least_outstanding.load.own_dispatch_correction=false`); values are parsed as JSON when they
//! can be (numbers, booleans) and taken as strings otherwise.

use super::Error;
use kvgate_core::PolicyConfig;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The scenario's view of `--set` values.
#[derive(Debug)]
pub struct Params<'a> {
    sets: &'a BTreeMap<String, String>,
    used: BTreeSet<String>,
    echo: BTreeMap<String, Value>,
}

fn parse_value(raw: &str) -> Value {
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
}

impl<'a> Params<'a> {
    /// Wraps the raw settings.
    pub fn new(sets: &'a BTreeMap<String, String>) -> Self {
        Params {
            sets,
            used: BTreeSet::new(),
            echo: BTreeMap::new(),
        }
    }

    fn raw(&mut self, key: &str) -> Option<&'a str> {
        self.used.insert(key.to_string());
        self.sets.get(key).map(String::as_str)
    }

    /// A number.
    pub fn f64(&mut self, key: &str, default: f64) -> Result<f64, Error> {
        let v = match self.raw(key) {
            None => default,
            Some(raw) => raw
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| Error::BadSetting {
                    key: key.to_string(),
                    why: format!("{raw:?} is not a number"),
                })?,
        };
        self.echo.insert(key.to_string(), serde_json::json!(v));
        Ok(v)
    }

    /// A number above zero: a rate, a shape.
    pub fn positive_f64(&mut self, key: &str, default: f64) -> Result<f64, Error> {
        let v = self.f64(key, default)?;
        if v > 0.0 {
            Ok(v)
        } else {
            Err(Error::BadSetting {
                key: key.to_string(),
                why: format!("{v} is not above zero"),
            })
        }
    }

    /// A non-negative integer.
    pub fn u64(&mut self, key: &str, default: u64) -> Result<u64, Error> {
        let v = match self.raw(key) {
            None => default,
            Some(raw) => {
                raw.trim()
                    .replace('_', "")
                    .parse::<u64>()
                    .map_err(|_| Error::BadSetting {
                        key: key.to_string(),
                        why: format!("{raw:?} is not a non-negative integer"),
                    })?
            }
        };
        self.echo.insert(key.to_string(), serde_json::json!(v));
        Ok(v)
    }

    /// A boolean (`true`/`false`).
    pub fn bool(&mut self, key: &str, default: bool) -> Result<bool, Error> {
        let v = match self.raw(key) {
            None => default,
            Some(raw) => raw.trim().parse::<bool>().map_err(|_| Error::BadSetting {
                key: key.to_string(),
                why: format!("{raw:?} is not true or false"),
            })?,
        };
        self.echo.insert(key.to_string(), Value::Bool(v));
        Ok(v)
    }

    /// A comma-separated list of numbers; `default` when unset.
    pub fn list_f64(&mut self, key: &str, default: &[f64]) -> Result<Vec<f64>, Error> {
        let v = match self.raw(key) {
            None => default.to_vec(),
            Some(raw) => raw
                .split(',')
                .map(|x| x.trim().parse::<f64>().ok().filter(|v| v.is_finite()))
                .collect::<Option<Vec<f64>>>()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| Error::BadSetting {
                    key: key.to_string(),
                    why: format!("{raw:?} is not a comma-separated list of numbers"),
                })?,
        };
        self.echo.insert(key.to_string(), serde_json::json!(v));
        Ok(v)
    }

    /// One of `choices`.
    pub fn choice(
        &mut self,
        key: &str,
        default: &'static str,
        choices: &[&'static str],
    ) -> Result<&'static str, Error> {
        let v =
            match self.raw(key) {
                None => default,
                Some(raw) => *choices.iter().find(|c| **c == raw.trim()).ok_or_else(|| {
                    Error::BadSetting {
                        key: key.to_string(),
                        why: format!("{raw:?} is not one of {}", choices.join(", ")),
                    }
                })?,
            };
        self.echo
            .insert(key.to_string(), Value::String(v.to_string()));
        Ok(v)
    }

    /// The configuration of policy `name`: its defaults, then `base` overrides from the
    /// scenario, then the user's `name.field=value` settings.
    pub fn policy(&mut self, name: &str, base: &[(&str, Value)]) -> Result<PolicyConfig, Error> {
        let config = PolicyConfig::default_for(name)
            .ok_or_else(|| Error::UnknownPolicy(name.to_string()))?;
        let mut tree = serde_json::to_value(&config).expect("policy configs serialise");
        for (path, value) in base {
            set_path(&mut tree, path, value.clone(), name)?;
        }
        let prefix = format!("{name}.");
        let user: Vec<(String, String)> = self
            .sets
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (key, raw) in user {
            self.used.insert(key.clone());
            set_path(&mut tree, &key[prefix.len()..], parse_value(&raw), name)?;
        }
        let config: PolicyConfig = serde_json::from_value(tree).map_err(|e| Error::BadSetting {
            key: name.to_string(),
            why: e.to_string(),
        })?;
        config.validate().map_err(|e| Error::BadSetting {
            key: name.to_string(),
            why: e.to_string(),
        })?;
        Ok(config)
    }

    /// The effective values read so far; fails on a key nothing read.
    pub fn finish(self) -> Result<BTreeMap<String, Value>, Error> {
        for key in self.sets.keys() {
            let policy_key = key
                .split_once('.')
                .is_some_and(|(p, _)| PolicyConfig::default_for(p).is_some());
            if !self.used.contains(key) && !policy_key {
                return Err(Error::UnknownSetting {
                    key: key.clone(),
                    known: self.echo.keys().cloned().collect::<Vec<_>>().join(", "),
                });
            }
        }
        Ok(self.echo)
    }
}

fn set_path(tree: &mut Value, path: &str, value: Value, policy: &str) -> Result<(), Error> {
    let mut node = tree;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let obj = node.as_object_mut().ok_or_else(|| Error::BadSetting {
            key: format!("{policy}.{path}"),
            why: "not a configuration field".into(),
        })?;
        if !obj.contains_key(*part) || *part == "name" {
            return Err(Error::BadSetting {
                key: format!("{policy}.{path}"),
                why: format!("{policy} has no parameter {part:?}"),
            });
        }
        if i + 1 == parts.len() {
            obj.insert(part.to_string(), value);
            return Ok(());
        }
        node = obj.get_mut(*part).expect("checked");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_defaults_overrides_and_rejects_unknown_keys() {
        let sets: BTreeMap<String, String> = [
            ("rate".to_string(), "0.05".to_string()),
            (
                "least_outstanding.load.own_dispatch_correction".to_string(),
                "false".to_string(),
            ),
        ]
        .into();
        let mut p = Params::new(&sets);
        assert_eq!(p.f64("rate", 0.2).unwrap(), 0.05);
        assert_eq!(p.u64("replicas", 4).unwrap(), 4);
        match p.policy("least_outstanding", &[]).unwrap() {
            PolicyConfig::LeastOutstanding(c) => assert!(!c.load.own_dispatch_correction),
            other => panic!("{other:?}"),
        }
        let echo = p.finish().unwrap();
        assert_eq!(echo["rate"], serde_json::json!(0.05));

        let bad: BTreeMap<String, String> = [("rat".to_string(), "1".to_string())].into();
        let mut p = Params::new(&bad);
        p.f64("rate", 0.2).unwrap();
        assert!(matches!(p.finish(), Err(Error::UnknownSetting { .. })));

        let bad_field: BTreeMap<String, String> =
            [("cache_aware.nope".to_string(), "1".to_string())].into();
        let mut p = Params::new(&bad_field);
        assert!(p.policy("cache_aware", &[]).is_err());
        let bad_num: BTreeMap<String, String> = [("rate".to_string(), "x".to_string())].into();
        assert!(Params::new(&bad_num).f64("rate", 1.0).is_err());
    }
}
