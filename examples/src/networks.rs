//! The network files shipped in the repository's `examples/networks/` folder, embedded so that
//! `--network NAME` works from any folder, and how `--network` tells a network file from a
//! link spec.

use gym_core::comm::network::{NetworkFile, NetworkFileError};
use std::path::Path;

/// Every shipped network file: the name `--network` takes, and the file's text (its
/// comments and `source` give the provenance of its figures).
///
/// * `aws-dtfm`: ten AWS regions, the delays and bandwidths measured by DT-FM (Yuan et
///   al., NeurIPS 2022), 64 nodes as in its world-wide scenario.
/// * `halos`: HALoS's four regions (Kim et al., ICML 2025), 16 accelerators of uneven
///   speeds.
/// * `consumer-internet`: home broadband peers on three continents, 12 nodes.
pub const NETWORK_FILES: [(&str, &str); 3] = [
    ("aws-dtfm", include_str!("../networks/aws-dtfm.toml")),
    ("halos", include_str!("../networks/halos.toml")),
    (
        "consumer-internet",
        include_str!("../networks/consumer-internet.toml"),
    ),
];

/// The names of the shipped network files, comma-separated.
pub fn network_file_names() -> String {
    NETWORK_FILES
        .iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The network file `arg` names, read and checked: a shipped file by its name, or the file
/// at the path `arg` (a path to a file that exists, or any value ending in `.toml`).
/// `None` when `arg` is neither, i.e. a link spec such as `1gbit:10ms`.
pub fn network_file(arg: &str) -> Option<Result<NetworkFile, NetworkFileError>> {
    let arg = arg.trim();
    if let Some((name, text)) = NETWORK_FILES.iter().find(|(name, _)| *name == arg) {
        return Some(NetworkFile::parse(
            text,
            &format!("examples/networks/{name}.toml (shipped as `{name}`)"),
        ));
    }
    let path = Path::new(arg);
    if arg.ends_with(".toml") || path.is_file() {
        return Some(NetworkFile::read(path).map_err(|e| match e {
            NetworkFileError::Read { file, message } => NetworkFileError::Read {
                file,
                message: format!(
                    "{message} (the shipped network files are named {})",
                    network_file_names()
                ),
            },
            other => other,
        }));
    }
    None
}
