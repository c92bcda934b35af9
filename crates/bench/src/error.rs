//! The error type of the library.

use std::path::PathBuf;

/// Why a benchmark could not run or report. Failures of individual requests are not errors:
/// they are counted by kind in the report.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Invalid flags or inputs.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A file could not be read or written.
    #[error("cannot access {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A replay file line is not valid JSON of the expected shape.
    #[error("{}:{line}: invalid request line", path.display())]
    Replay {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
    /// JSON output could not be serialised.
    #[error("cannot serialise the JSON report")]
    Json(#[source] serde_json::Error),
    /// The plot could not be drawn.
    #[error("cannot draw the plot {}: {message}", path.display())]
    Plot {
        /// The file.
        path: PathBuf,
        /// What went wrong (plotters errors are not `'static`).
        message: String,
    },
}
