//! What every clone of a [`Client`](crate::Client) and each of its requests share: the
//! `reqwest::Client`, the settings and the redirect policy. Apart from `mod.rs`, so a request
//! can hold it without importing the client that builds requests.

use std::fmt;
use std::sync::Arc;

use super::redirect::RedirectPolicy;
use crate::engine::settings::Settings;

pub(crate) struct ClientRef {
    pub(crate) http: reqwest::Client,
    pub(crate) settings: Arc<Settings>,
    /// The redirects the client follows itself (the other front ends follow none).
    pub(crate) redirects: RedirectPolicy,
}

impl fmt::Debug for ClientRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.settings.debug_as("Client", f)
    }
}
