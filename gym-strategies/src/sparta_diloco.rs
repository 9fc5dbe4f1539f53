//! SPARTA + DiLoCo: sparse averaging every few steps and a DiLoCo outer step every H steps.

use crate::communicate::composed_strategy;
use crate::diloco::DiLoCoCommunicatorConfig;
use crate::sparta::SparseCommunicatorConfig;
use burn::config::Config;
use gym_core::InnerOptimizerConfig;

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "sparta-diloco";

/// The hybrid of the original's `SPARTADiLoCoStrategy`, with SPARTA's own sync interval
/// honoured (the original stores its `sparta_interval` and ignores it): modules
/// `[sparse averaging, DiLoCo]`, in that order.
#[derive(Config, Debug)]
pub struct SpartaDiLoCoConfig {
    /// Each node's own optimizer (default AdamW), clipping its local gradient.
    #[config(default = "InnerOptimizerConfig::new()")]
    pub inner: InnerOptimizerConfig,
    /// The sparse averaging, with its own `sync_interval`.
    #[config(default = "SparseCommunicatorConfig::new()")]
    pub sparta: SparseCommunicatorConfig,
    /// The DiLoCo synchronisation.
    #[config(default = "DiLoCoCommunicatorConfig::new()")]
    pub diloco: DiLoCoCommunicatorConfig,
}

composed_strategy!(SpartaDiLoCoConfig, NAME, |c| [
    c.sparta.clone(),
    c.diloco.clone()
]);
/// SPARTA+DiLoCo in the product's registry: its flags and how they build it.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::diloco::cli::communicator;
    use crate::registry::SpartaArgs;
    use crate::registry::{Entry, OptimizerArgs, Shared};
    use crate::sparta::cli::communicator as sparta_communicator;

    /// SPARTA+DiLoCo in the registry.
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "SPARTA every --sparta-sync-interval steps plus DiLoCo every H steps",
        // SPARTA's flags, then DiLoCo's (`crate::diloco::cli::READS`).
        uses: &[
            Shared::Sparta,
            Shared::Sync,
            Shared::Outer,
            Shared::Compression,
            Shared::Quorum,
        ],
        flags: None,
        build: |f| {
            Ok(Box::new(
                SpartaDiLoCoConfig::new()
                    .with_inner(f.get::<OptimizerArgs>()?.inner())
                    .with_sparta(sparta_communicator(&f.get::<SpartaArgs>()?)?)
                    .with_diloco(communicator(f, DiLoCoCommunicatorConfig::new())?),
            ))
        },
    };
}
