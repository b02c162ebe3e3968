//! The service's errors: a value that is not valid (an option, a config
//! key, a request's field), a config file with errors, or the host failing
//! it. Each has its exit code (as the daemon's: 2 for invalid input, 1 for
//! the rest), its HTTP status and its gRPC code, so that a field a request
//! got wrong is answered as the command line reports it.

use ratelimit_host::{Invalid, config_file::ConfigErrors};

/// Everything the service can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value given by the user (an option, a config key, a request's
    /// field) is not valid. Nothing was changed.
    #[error("{field}: {message}")]
    Invalid {
        /// The option, key or field, as the user wrote it.
        field: String,
        /// What was wrong and which forms are accepted.
        message: String,
    },
    /// A config file with errors: every one of them, each with its line.
    #[error("{0}")]
    Config(ConfigErrors),
    /// The host failed the service (the runtime could not start).
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// The service's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Invalid`].
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The process's exit code: 2 for invalid input (clap's usage errors
    /// exit 2 too), 1 for the rest, as `ratelimit`'s own.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Invalid { .. } | Error::Config(_) => 2,
            Error::Io { .. } => 1,
        }
    }

    /// The HTTP status a request that failed with it is answered.
    pub fn http_status(&self) -> u16 {
        match self {
            Error::Invalid { .. } | Error::Config(_) => 400,
            Error::Io { .. } => 500,
        }
    }

    /// The gRPC code a call that failed with it is answered.
    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            Error::Invalid { .. } | Error::Config(_) => tonic::Code::InvalidArgument,
            Error::Io { .. } => tonic::Code::Internal,
        }
    }
}

impl From<Invalid> for Error {
    fn from(e: Invalid) -> Self {
        Self::Invalid {
            field: e.field,
            message: e.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_answers_with_its_code_status_and_grpc_code() {
        let invalid = Error::invalid("--listen", "bad");
        assert_eq!(
            (
                invalid.exit_code(),
                invalid.http_status(),
                invalid.grpc_code()
            ),
            (2, 400, tonic::Code::InvalidArgument)
        );
        let io = Error::Io {
            what: "starting the async runtime".into(),
            source: std::io::Error::other("no threads"),
        };
        assert_eq!(
            (io.exit_code(), io.http_status(), io.grpc_code()),
            (1, 500, tonic::Code::Internal)
        );
    }
}
