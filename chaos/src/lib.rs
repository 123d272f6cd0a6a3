//! Failure drills against a running cloud. Arrives with issue 7.
