//! Where images are kept and how they are reached: a repository in a
//! registry or an OCI layout directory ([`repo`], [`layout`]), named by
//! [`reference`]s, read through the registry's mirrors ([`mirrors`],
//! [`host_reader`]) with the credentials of [`auth`], every request bounded
//! as [`request`] says; the documents' [`media_types`].

pub mod auth;
pub(crate) mod host_reader;
pub(crate) mod layout;
pub(crate) mod media_types;
pub mod mirrors;
pub mod reference;
pub mod repo;
pub(crate) mod request;
