//! An error and its causes as one line.
//!
//! anyhow's `{:#}` writes every cause after its error. The libraries' errors often name
//! their cause in their own message too (`SGP: {0}`), so that they read whole when written
//! alone; chained, such a cause would be written twice or more.

use std::error::Error;

/// `err` and each cause its message does not already end with, joined by `": "`.
pub(crate) fn describe(err: &anyhow::Error) -> String {
    let mut text = err.to_string();
    let mut cause: Option<&(dyn Error + 'static)> = err.source();
    while let Some(error) = cause {
        let message = error.to_string();
        if !text.ends_with(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        cause = error.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use anyhow::Context as _;

    use super::describe;

    #[derive(Debug, thiserror::Error)]
    #[error("no mass yet")]
    struct Inner;

    #[derive(Debug, thiserror::Error)]
    #[error("SGP: {0}")]
    struct Wraps(#[from] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("the link dropped")]
    struct Silent;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot send")]
    struct Hides(#[source] Silent);

    #[test]
    fn a_cause_already_in_its_errors_message_is_written_once() {
        let err = Err::<(), _>(Wraps::from(Inner))
            .context("the engine stopped")
            .unwrap_err();
        assert_eq!(
            format!("{err:#}"),
            "the engine stopped: SGP: no mass yet: no mass yet"
        );
        assert_eq!(describe(&err), "the engine stopped: SGP: no mass yet");
    }

    #[test]
    fn a_cause_its_error_does_not_name_is_written_after_it() {
        let err = Err::<(), _>(Hides(Silent)).context("step 3").unwrap_err();
        assert_eq!(describe(&err), "step 3: cannot send: the link dropped");
    }
}
