//! The media types of the manifests, configs and layers gkm reads and
//! writes.

/// OCI image manifest media type.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index media type.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// OCI image config media type.
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// OCI zstd-compressed layer.
pub const OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
/// OCI gzip-compressed layer.
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// OCI uncompressed layer.
pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// Docker schema2 manifest media type (what MCV's docker builds push).
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker manifest list media type.
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Docker image config media type.
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
/// Docker gzip layer media type.
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

/// Every manifest media type gkm reads.
pub const MANIFEST_TYPES: &[&str] = &[
    OCI_MANIFEST,
    DOCKER_MANIFEST,
    OCI_INDEX,
    DOCKER_MANIFEST_LIST,
];
