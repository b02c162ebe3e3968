//! The envelope of every answer on the control socket: whether the request
//! was carried out, why not, and its answer. The daemon's control server
//! writes it from a handler's [`Answer`] or error; the CLI reads `data` into
//! the answer type of the request it sent ([`Response::into_answer`]).

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::answer::Answer;
use crate::error::{Error, Result};

/// The daemon's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Response {
    /// Whether the request was carried out.
    pub ok: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When the request was refused for invalid input: the field (option,
    /// config key or argument) at fault. `error` then starts with `FIELD: `.
    /// The CLI exits with the invalid-input code rather than the refused one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid: Option<String>,
    /// The answer: one of [`super::answer`]'s, the one of the request.
    #[serde(default)]
    pub data: serde_json::Value,
}

impl Response {
    /// A refusal.
    pub fn refused(why: impl Into<String>) -> Self {
        Self {
            ok: false,
            error: Some(why.into()),
            invalid: None,
            data: serde_json::Value::Null,
        }
    }

    /// A refusal for `e`, its whole chain as the reason; invalid input keeps
    /// its field.
    pub fn refused_for(e: &Error) -> Self {
        Self {
            invalid: match e {
                Error::Invalid { field, .. } => Some(field.clone()),
                _ => None,
            },
            ..Self::refused(crate::error::chain(e))
        }
    }

    /// A request carried out, with its answer.
    pub fn ok(answer: &Answer) -> Self {
        Self {
            ok: true,
            error: None,
            invalid: None,
            data: serde_json::to_value(answer).expect("answers serialize"),
        }
    }

    /// What a handler's outcome says to the client.
    pub fn of(outcome: &Result<Answer>) -> Self {
        match outcome {
            Ok(answer) => Self::ok(answer),
            Err(e) => Self::refused_for(e),
        }
    }

    /// What the CLI makes of the answer: `A`, the answer of the request it
    /// sent, or the error it carries.
    pub fn into_answer<A: DeserializeOwned>(self) -> Result<A> {
        if self.ok {
            return serde_json::from_value(self.data).map_err(|e| {
                Error::Refused(format!(
                    "the daemon sent an answer this ratelimit cannot read ({e})"
                ))
            });
        }
        let why = self.error.unwrap_or_else(|| "refused".into());
        Err(match self.invalid {
            Some(field) => Error::Invalid {
                message: why
                    .strip_prefix(&format!("{field}: "))
                    .unwrap_or(&why)
                    .to_string(),
                field,
            },
            None => Error::Refused(why),
        })
    }
}
