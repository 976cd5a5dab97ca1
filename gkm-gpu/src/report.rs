//! The inventory as text for people (`gkm gpus`).

use std::fmt::Write;

use crate::inventory::{Inventory, NvmlStatus};

/// Renders an inventory as aligned tables: GPUs, VFIO devices, vGPUs, what
/// NVML said, and warnings last.
///
/// ```
/// let inventory = gkm_gpu::simulate::parse("gpus: [{profile: T4}]", "t4.yaml".as_ref())?;
/// let text = gkm_gpu::report::render(&inventory);
/// assert!(text.contains("Tesla T4"));
/// assert!(text.contains("sm_75"));
/// # Ok::<(), gkm_gpu::Error>(())
/// ```
pub fn render(inventory: &Inventory) -> String {
    let mut out = String::new();
    if inventory.simulated {
        out.push_str("Simulated inventory.\n");
    }
    if inventory.gpus.is_empty() {
        out.push_str("No GPUs found.\n");
    } else {
        let rows: Vec<Vec<String>> = inventory
            .gpus
            .iter()
            .map(|g| {
                vec![
                    g.index.to_string(),
                    g.product.clone(),
                    g.backend.map_or_else(|| "-".into(), |b| b.to_string()),
                    g.arch.as_ref().map_or_else(
                        || "-".into(),
                        |a| a.sm_name().unwrap_or_else(|| a.to_string()),
                    ),
                    opt(g.warp_size),
                    g.memory_bytes.map_or_else(|| "-".into(), gib),
                    g.pci_address.clone().unwrap_or_else(|| "-".into()),
                    match (&g.kernel_driver, &g.driver_version) {
                        (Some(d), Some(v)) => format!("{d} {v}"),
                        (Some(d), None) => d.clone(),
                        (None, Some(v)) => v.clone(),
                        (None, None) => "-".into(),
                    },
                    g.numa_node.map_or_else(|| "-".into(), |n| n.to_string()),
                ]
            })
            .collect();
        table(
            &mut out,
            &[
                "GPU", "PRODUCT", "BACKEND", "ARCH", "WARP", "MEMORY", "PCI", "DRIVER", "NUMA",
            ],
            &rows,
        );
    }
    if !inventory.vfio.is_empty() {
        out.push_str("\nVFIO passthrough devices:\n");
        let rows: Vec<Vec<String>> = inventory
            .vfio
            .iter()
            .map(|v| {
                vec![
                    v.pci_address.clone(),
                    v.product.clone(),
                    v.driver.clone(),
                    v.iommu_group.map_or_else(|| "-".into(), |g| g.to_string()),
                    if v.group_members.is_empty() {
                        "-".into()
                    } else {
                        v.group_members
                            .iter()
                            .map(|m| {
                                format!(
                                    "{} ({})",
                                    m.pci_address,
                                    m.driver.as_deref().unwrap_or("no driver")
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    },
                    if v.group_viable { "yes" } else { "no" }.into(),
                ]
            })
            .collect();
        table(
            &mut out,
            &[
                "PCI",
                "PRODUCT",
                "DRIVER",
                "IOMMU GROUP",
                "GROUP MEMBERS",
                "VIABLE",
            ],
            &rows,
        );
    }
    if !inventory.mdevs.is_empty() {
        out.push_str("\nMediated devices (vGPUs):\n");
        let rows: Vec<Vec<String>> = inventory
            .mdevs
            .iter()
            .map(|m| {
                vec![
                    m.uuid.clone(),
                    m.type_id.clone(),
                    m.type_name.clone().unwrap_or_else(|| "-".into()),
                    m.parent_address.clone(),
                    m.parent_product.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        table(
            &mut out,
            &["UUID", "TYPE", "NAME", "PARENT", "PARENT PRODUCT"],
            &rows,
        );
    }
    match &inventory.nvml {
        NvmlStatus::NotChecked => {}
        NvmlStatus::NoDriver { reason } => {
            let _ = writeln!(out, "\nNVIDIA: no NVIDIA driver here ({reason}).");
        }
        NvmlStatus::Loaded {
            driver_version,
            cuda_driver_version,
            device_count,
        } => {
            let _ = writeln!(
                out,
                "\nNVIDIA: driver {driver_version}, CUDA {}, {device_count} device(s).",
                cuda_driver_version.as_deref().unwrap_or("unknown")
            );
        }
        NvmlStatus::Failed { reason } => {
            let _ = writeln!(out, "\nNVIDIA: NVML failed: {reason}.");
        }
    }
    if !inventory.warnings.is_empty() {
        out.push_str("\nWarnings:\n");
        for w in &inventory.warnings {
            let _ = writeln!(out, "  {w}");
        }
    }
    out
}

fn opt(v: Option<u32>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn gib(bytes: u64) -> String {
    // Display only: two decimals of GiB.
    let hundredths = bytes.saturating_mul(100) >> 30;
    format!("{}.{:02} GiB", hundredths / 100, hundredths % 100)
}

/// Appends `rows` under `header` to `out` as plain columns, each as wide as
/// its widest cell and two spaces apart (no trailing blanks).
///
/// ```
/// let mut out = String::new();
/// gkm_gpu::report::table(&mut out, &["A", "LONG"], &[vec!["xyz".into(), "1".into()]]);
/// assert_eq!(out, "A    LONG\nxyz  1\n");
/// ```
pub fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, cell) in cells.enumerate() {
            let _ = write!(s, "{cell:<width$}  ", width = widths[i]);
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(out, &mut header.iter().copied());
    for row in rows {
        line(out, &mut row.iter().map(String::as_str));
    }
}
