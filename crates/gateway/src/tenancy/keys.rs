//! Client API keys, kept only as SHA-256 digests: the configuration, the store and the admin API
//! never hold a key itself, and lookups compare digests (which do not leak a key's prefix
//! through timing the way comparing keys byte by byte would).

use super::config::KeyConfig;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// A key's digest.
pub(crate) type Digest = [u8; 32];

/// Parses 64 hex digits.
pub(crate) fn parse_sha256(hex: &str) -> Result<Digest, String> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return Err(format!(
            "must be 64 hex digits (a SHA-256), not {} characters",
            bytes.len()
        ));
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).map_err(|_| "must be hex digits".to_string())?;
        out[i] = u8::from_str_radix(s, 16).map_err(|_| "must be hex digits".to_string())?;
    }
    Ok(out)
}

/// The digest of a presented key.
pub(crate) fn digest(key: &str) -> Digest {
    let d = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Lower-case hex of a digest.
pub(crate) fn hex(d: &Digest) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh random key, `kvg-` and 48 hex digits (192 bits from the OS).
pub(crate) fn generate() -> Result<String, ring::error::Unspecified> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 24];
    ring::rand::SystemRandom::new().fill(&mut bytes)?;
    Ok(format!(
        "kvg-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

/// The known keys.
#[derive(Debug, Default)]
pub(crate) struct KeyStore {
    by_digest: RwLock<HashMap<Digest, Arc<KeyConfig>>>,
}

impl KeyStore {
    /// Adds or replaces a key (by name and by digest).
    pub(crate) fn insert(&self, key: KeyConfig) -> Result<(), String> {
        let d = parse_sha256(&key.key_sha256)?;
        let mut map = self.by_digest.write().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, k| k.name != key.name);
        map.insert(d, Arc::new(key));
        Ok(())
    }

    /// Removes the key named `name`; whether there was one.
    pub(crate) fn remove(&self, name: &str) -> bool {
        let mut map = self.by_digest.write().unwrap_or_else(|e| e.into_inner());
        let before = map.len();
        map.retain(|_, k| k.name != name);
        map.len() != before
    }

    /// The key presented as `key`, if known.
    pub(crate) fn lookup(&self, key: &str) -> Option<Arc<KeyConfig>> {
        let map = self.by_digest.read().unwrap_or_else(|e| e.into_inner());
        map.get(&digest(key)).cloned()
    }

    /// Whether any key exists (then every request needs one).
    pub(crate) fn enforced(&self) -> bool {
        !self
            .by_digest
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Every key, by name.
    pub(crate) fn list(&self) -> Vec<Arc<KeyConfig>> {
        let map = self.by_digest.read().unwrap_or_else(|e| e.into_inner());
        let mut keys: Vec<_> = map.values().cloned().collect();
        keys.sort_by(|a, b| a.name.cmp(&b.name));
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_found_by_digest_only() {
        let store = KeyStore::default();
        assert!(!store.enforced());
        let key = generate().unwrap();
        assert!(key.starts_with("kvg-") && key.len() == 52);
        store
            .insert(KeyConfig {
                name: "a".into(),
                key_sha256: hex(&digest(&key)),
                ..Default::default()
            })
            .unwrap();
        assert!(store.enforced());
        assert_eq!(store.lookup(&key).unwrap().name, "a");
        assert!(store.lookup("kvg-other").is_none());
        // sha256("abc"), the FIPS 180-2 test vector.
        assert_eq!(
            hex(&digest("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(parse_sha256("xyz").is_err());
        assert!(store.remove("a") && !store.remove("a") && !store.enforced());
    }
}
