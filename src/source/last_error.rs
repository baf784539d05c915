//! A source's last error, for observers (`/api/sources`, the page's health view): why its stream
//! was last lost, or why it could not connect, and when. Written by the supervisor (after each
//! loss, at most once per attempt, never per frame) under a mutex no frame takes; read by the
//! HTTP threads. The message never holds a password: it passes through `spec::redact_all` (any
//! URL in it loses its password) and the source's own URI's `scrub` (the password in any form).

use std::sync::PoisonError;
use std::time::SystemTime;

use super::{SourceCounters, SourceUri};

/// Why the stream was last lost, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastError {
    pub message: String,
    pub at: SystemTime,
}

impl SourceCounters {
    /// The last loss's reason, redacted.
    pub fn last_error(&self) -> Option<LastError> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Keeps `reason` as the last error, with no password in it.
    pub(super) fn set_last_error(&self, uri: &SourceUri, reason: &str) {
        let message = uri.scrub(&crate::spec::redact_all(reason));
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(LastError {
            message,
            at: SystemTime::now(),
        });
    }
}
