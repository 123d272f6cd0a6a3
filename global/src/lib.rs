//! The stateless global tier (public API, auth, idempotency routing). Arrives with issue 3.
