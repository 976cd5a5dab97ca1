//! The vocabulary of gkm's DRA driver, `gpu.gkm.io`: the names of the
//! attributes its ResourceSlices publish, and the CEL selectors written
//! against them. The driver (`gkm-k8s-dra`) publishes with these names and
//! the operator selects with them, so both read them from here; an
//! embedder writing its own DeviceClasses or claims can too.

pub mod selector;

/// The DRA driver's name: DeviceClasses select `device.driver ==
/// "gpu.gkm.io"`, and unqualified attributes are in this domain.
pub const DRIVER: &str = "gpu.gkm.io";

/// Upstream's attribute for a device's PCI address (`0000:6e:00.0`).
pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// Upstream's attribute for the PCIe root complex a device hangs off
/// (`pci0000:00`), for aligning devices of several drivers.
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

/// A GPU's compiler backend (`cuda`, `hip`), as Triton names it.
pub const BACKEND: &str = "backend";
/// A GPU's architecture: `sm_90` for CUDA, the gfx target (`gfx90a`) for AMD.
pub const ARCHITECTURE: &str = "architecture";
/// A CUDA GPU's compute capability, a version (`9.0.0`).
pub const COMPUTE_CAPABILITY: &str = "computeCapability";
/// A GPU's warp size, an int (left out when not known).
pub const WARP_SIZE: &str = "warpSize";
/// The CUDA (or ROCm) version a GPU's driver supports, a version (`12.4.0`).
pub const TOOLKIT_VERSION: &str = "toolkitVersion";
