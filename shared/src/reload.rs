//! Material a running server replaces without a restart: keys, CAs and
//! the HTTP clients built from them (`gangway global|region|agent` re-read
//! theirs on SIGHUP, docs/operations.md).
//!
//! A [`Reloadable`] holds an `Arc` of the value in use. Work takes the
//! current `Arc` once ([`Reloadable::current`]) and keeps it for as long as
//! it lasts, so a request in flight finishes with the keys and the client
//! it began with; [`Reloadable::replace`] puts a new value in place for
//! every piece of work that starts afterwards. Nothing is ever half
//! replaced: build the whole new value first (a verifier with all its
//! keys, a client with its CA), and swap it in only when every part of it
//! loaded.
//!
//! `std::sync::RwLock<Arc<T>>` rather than a lock-free crate: a read is a
//! read lock and a reference-count increment, once per request, and a
//! write happens when an operator sends SIGHUP.

use std::sync::{Arc, RwLock};

/// A value shared by every clone of this handle that [`replace`] swaps
/// whole. Cloning the handle is cheap; every clone sees a replacement.
///
/// [`replace`]: Reloadable::replace
pub struct Reloadable<T> {
    current: Arc<RwLock<Arc<T>>>,
}

impl<T> Clone for Reloadable<T> {
    fn clone(&self) -> Self {
        Reloadable {
            current: self.current.clone(),
        }
    }
}

impl<T> Reloadable<T> {
    pub fn new(value: T) -> Self {
        Reloadable {
            current: Arc::new(RwLock::new(Arc::new(value))),
        }
    }

    /// The value in use now. Hold on to it for the whole of one piece of
    /// work (a request, a call) rather than asking again midway.
    pub fn current(&self) -> Arc<T> {
        // A writer only ever stores a whole Arc: a poisoned lock still
        // holds a valid value.
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Puts `value` in use for whatever starts from now on; holders of the
    /// previous one keep it until they let it go.
    pub fn replace(&self, value: T) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(value);
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Reloadable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Reloadable").field(&self.current()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_keeps_what_it_took_and_the_next_reader_sees_the_new_value() {
        let keys = Reloadable::new("a");
        let other_handle = keys.clone();
        let in_flight = keys.current();
        other_handle.replace("b");
        assert_eq!(*in_flight, "a");
        assert_eq!(*keys.current(), "b");
    }
}
