//! What every long-running gkm daemon that talks to the apiserver
//! (operator, agent, device plugin, DRA plugin, scheduler extender) shares
//! around its own work. What of it needs no Kubernetes API ([`endpoints`],
//! [`server`], [`readiness`] but its apiserver checks, [`metrics`],
//! [`tasks`]) is `gkm_k8s_daemon`, re-exported here; the CSI driver, which
//! never reads the apiserver, takes that crate alone.
//!
//! - [`endpoints`]: what the daemon answers over HTTP — `/healthz`,
//!   `/readyz`, `/metrics` and any routes of its own (the extender's verbs,
//!   the admission webhooks).
//! - [`server`]: serving those endpoints on a socket, plain or over TLS, in
//!   the foreground or as a background [`server::EndpointServer`].
//! - [`readiness`]: the named conditions `/readyz` waits for, and the checks
//!   that wait until the apiserver serves a resource.
//! - [`metrics`]: values sampled at each scrape and the build information.
//! - [`tasks`]: blocking work off the async threads, and a panic in one
//!   object's work contained to it.
//! - [`leader`]: leader election on a Lease, so one replica runs the
//!   controllers.
//! - [`identity`]: the User-Agent its apiserver client sends, which names
//!   the field manager of its writes that name none.
//! - [`relist`]: what a watch's relist showed, so its consumer drops the
//!   rest when it ends.
//! - [`watched_index`]: objects of one kind as a watch shows them, kept as
//!   the facts their readers need and indexed by the key they look them up
//!   by.
//! - [`client`]: the apiserver client, from a kubeconfig or in-cluster, with
//!   that User-Agent.
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use std::sync::Arc;
//! use gkm_k8s_runtime::endpoints::Endpoints;
//! use gkm_k8s_runtime::readiness::Readiness;
//! use gkm_k8s_runtime::server::serve;
//! use prometheus_client::registry::Registry;
//!
//! let readiness = Readiness::default();
//! let synced = readiness.check("caches-synced");
//! let endpoints = Arc::new(Endpoints::new(Registry::with_prefix("gkm"), readiness));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! tokio::spawn(serve(listener, endpoints, std::future::pending()));
//! // … once the controllers' caches are filled:
//! synced.set(true);
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

pub mod client;
pub mod identity;
pub mod leader;
pub mod readiness;
pub mod relist;
pub mod watched_index;

pub use gkm_k8s_daemon::{endpoints, metrics, server, tasks};
