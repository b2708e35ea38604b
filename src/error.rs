//! The crate's error type and its single mapping onto gRPC status codes.

use std::fmt;

/// Shorthand for results whose error is the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One problem found in one manifest file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    /// The file's path as given (or the demo manifest's name).
    pub path: String,
    /// `(line, column)`, 1-based, for syntax errors.
    pub position: Option<(usize, usize)>,
    /// What is wrong, naming the field, tool or domain.
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, col)) => write!(f, "{}:{line}:{col}: {}", self.path, self.message),
            None => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

/// Every problem found while loading a set of manifests (loading fails as a whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestErrors(pub Vec<ManifestError>);

impl fmt::Display for ManifestErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// What went wrong, phrased for the caller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Manifests failed validation; every problem is listed.
    #[error("{0}")]
    Manifests(ManifestErrors),
    /// A request field is missing or out of bounds; the text says which and why.
    #[error("{0}")]
    InvalidArgument(String),
    /// A named thing (a tool group) does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request is well formed but the system is not in a state to serve it.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A dependency (the database) cannot be used right now; retrying later may work.
    #[error("{0}")]
    Unavailable(String),
    /// Bad configuration (flags, environment, config file).
    #[error("{0}")]
    Config(String),
    /// A database fault.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A migration could not be applied.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The keyword automaton could not be built.
    #[error("keyword automaton: {0}")]
    Automaton(#[from] aho_corasick::BuildError),
    /// A request that is not a valid protobuf encoding of its message (including a string
    /// field that is not UTF-8).
    #[error("The request could not be decoded: {0}")]
    Decode(prost::DecodeError),
    /// A fault reported through a shared cache load, already described.
    #[error("{0}")]
    Shared(String),
    /// Reading a manifest folder or another file failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being read.
        context: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// The most characters of a caller's value an error message repeats (SPEC §5).
pub const MAX_ECHO_CHARS: usize = 128;

/// A caller's value as an error message may repeat it: cut to [`MAX_ECHO_CHARS`] characters
/// with `…` appended, so an error never grows with the input (some gRPC clients refuse
/// large status messages).
pub fn echo(value: &str) -> std::borrow::Cow<'_, str> {
    match value.char_indices().nth(MAX_ECHO_CHARS) {
        None => value.into(),
        Some((cut, _)) => format!("{}…", &value[..cut]).into(),
    }
}

impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        match err {
            Error::InvalidArgument(m) => tonic::Status::invalid_argument(m),
            // The caller sent bytes that are not its request message: its mistake, not ours.
            Error::Decode(_) => {
                tracing::warn!(error = %err, "request refused: not decodable");
                tonic::Status::invalid_argument(err.to_string())
            }
            Error::NotFound(m) => tonic::Status::not_found(m),
            Error::FailedPrecondition(m) => tonic::Status::failed_precondition(m),
            // The database cannot be used: the caller may retry, and learns why.
            Error::Unavailable(_) | Error::Database(_) | Error::Shared(_) => {
                crate::telemetry::DATABASE_ERRORS.inc();
                tracing::warn!(error = %err, "request failed: database unavailable");
                tonic::Status::unavailable(err.to_string())
            }
            other => {
                // The cause is for the operator's log, not for the client.
                tracing::error!(error = %other, "internal error");
                tonic::Status::internal("internal error")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoed_values_are_cut_to_128_characters_with_an_ellipsis() {
        let cases: &[(String, String)] = &[
            (String::new(), String::new()),
            ("abc".into(), "abc".into()),
            ("x".repeat(128), "x".repeat(128)),
            ("x".repeat(129), format!("{}…", "x".repeat(128))),
            ("é".repeat(20_000), format!("{}…", "é".repeat(128))),
        ];
        for (value, want) in cases {
            assert_eq!(echo(value), want.as_str(), "{} chars", value.chars().count());
        }
    }
}
