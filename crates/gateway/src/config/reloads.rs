//! The record of configuration reloads, for `GET /admin/config` and the log.

use std::time::SystemTime;

/// Reloads so far and how the last one went, for `GET /admin/config` and the log.
#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct ReloadLog {
    /// The file watched, if any.
    pub(crate) file: Option<String>,
    pub(crate) applied: u64,
    pub(crate) rejected: u64,
    /// The last reload: `applied` or `rejected`, when (RFC 3339) and, if rejected, why.
    pub(crate) last: Option<LastReload>,
}

/// One reload's result.
#[derive(Debug, serde::Serialize)]
pub(crate) struct LastReload {
    pub(crate) result: &'static str,
    pub(crate) at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// Sections the file changed that a reload does not apply (they take effect on restart).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) restart_needed: Vec<String>,
}

impl ReloadLog {
    pub(crate) fn record(&mut self, error: Option<String>, restart_needed: Vec<String>) {
        let result = match error {
            None => {
                self.applied += 1;
                "applied"
            }
            Some(_) => {
                self.rejected += 1;
                "rejected"
            }
        };
        self.last = Some(LastReload {
            result,
            at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            error,
            restart_needed,
        });
    }
}
