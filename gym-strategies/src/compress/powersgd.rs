//! PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019, arXiv 1905.13727).
//!
//! SKELETON: bodies to be written (see the module's task).

use super::{Compressor, PendingMean};
use burn::tensor::Tensor;
use gym_core::{Group, NodeInfo, Result, StepContext};
use serde::{Deserialize, Serialize};

/// Settings of PowerSGD compression.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PowerSgdCompressionConfig {
    /// Rank r of the factors.
    pub rank: usize,
}

impl PowerSgdCompressionConfig {
    /// The defaults.
    pub fn new() -> Self {
        PowerSgdCompressionConfig { rank: 4 }
    }

    /// With rank `rank`.
    pub fn with_rank(mut self, rank: usize) -> Self {
        self.rank = rank;
        self
    }

    /// Refuses settings it cannot run with, naming them.
    pub fn validate(&self) -> Result<()> {
        todo!()
    }

    /// The compressor of one node.
    pub fn init(&self, node: &NodeInfo<'_>, stream: u64) -> Result<PowerSgdCompressor> {
        todo!()
    }
}

impl Default for PowerSgdCompressionConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// One node's PowerSGD state.
pub struct PowerSgdCompressor {}

impl Compressor for PowerSgdCompressor {
    fn start_mean(
        &mut self,
        group: &Group,
        x: Tensor<1>,
        ctx: &StepContext<'_>,
    ) -> Result<PendingMean> {
        todo!()
    }
}
