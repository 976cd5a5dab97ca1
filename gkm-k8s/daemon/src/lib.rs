//! What every long-running gkm daemon shares around its own work that needs
//! no Kubernetes API: the parts a node-side daemon that never reads the
//! apiserver (the CSI driver) takes alone, and `gkm_k8s_runtime` re-exports
//! for the others.
//!
//! - [`endpoints`]: what the daemon answers over HTTP — `/healthz`,
//!   `/readyz`, `/metrics` and any routes of its own (the extender's verbs,
//!   the admission webhooks).
//! - [`server`]: serving those endpoints on a socket, plain or over TLS, in
//!   the foreground or as a background [`server::EndpointServer`].
//! - [`readiness`]: the named conditions `/readyz` waits for.
//! - [`metrics`]: values sampled at each scrape and the build information.
//! - [`tasks`]: blocking work off the async threads, and a panic in one
//!   object's work contained to it.
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use std::sync::Arc;
//! use gkm_k8s_daemon::endpoints::Endpoints;
//! use gkm_k8s_daemon::readiness::Readiness;
//! use gkm_k8s_daemon::server::serve;
//! use prometheus_client::registry::Registry;
//!
//! let readiness = Readiness::default();
//! let synced = readiness.check("caches-synced");
//! let endpoints = Arc::new(Endpoints::new(Registry::with_prefix("gkm"), readiness));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! tokio::spawn(serve(listener, endpoints, std::future::pending()));
//! // … once the daemon's state is filled:
//! synced.set(true);
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

pub mod endpoints;
pub mod metrics;
pub mod readiness;
pub mod server;
pub mod tasks;
