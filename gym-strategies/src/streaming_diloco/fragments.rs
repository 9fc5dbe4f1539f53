//! The fragments of Streaming DiLoCo: how the parameters are split ([`FragmentPattern`]),
//! and a fragment's values taken out of the flat buffer and put back.

use burn::tensor::Tensor;
use gym_core::ParamLayout;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// How the parameters are split into fragments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum FragmentPattern {
    /// Contiguous runs of whole parameters in layout order, with element counts as balanced
    /// as whole parameters allow (the paper's "sequential": consecutive blocks).
    #[default]
    Sequential,
    /// Parameter `i` (in layout order) goes to fragment `i mod F` (the paper's "strided":
    /// interleaved blocks).
    Strided,
}

impl FragmentPattern {
    /// The parameter indices (in [`ParamLayout::entries`] order) of each of the `fragments`
    /// fragments of `layout`. Every fragment is non-empty when `1 ≤ fragments ≤` the number
    /// of parameters; the fragments partition the parameters.
    pub fn split(self, layout: &ParamLayout, fragments: usize) -> Vec<Vec<usize>> {
        let n_params = layout.entries().len();
        let f = fragments.clamp(1, n_params.max(1));
        match self {
            FragmentPattern::Strided => {
                (0..f).map(|p| (p..n_params).step_by(f).collect()).collect()
            }
            FragmentPattern::Sequential => {
                let total = layout.num_elements() as f64;
                // `starts[p]`: the first parameter of fragment p. Each boundary is the one
                // whose element offset is nearest p·N/F, leaving at least one parameter to
                // every fragment on either side (the first nearest on ties).
                let mut starts = vec![0];
                for p in 1..f {
                    let target = p as f64 * total / f as f64;
                    let lo = starts[p - 1] + 1;
                    let hi = n_params - (f - p);
                    let best = (lo..=hi)
                        .min_by(|&a, &b| {
                            let da = (layout.entries()[a].offset as f64 - target).abs();
                            let db = (layout.entries()[b].offset as f64 - target).abs();
                            da.total_cmp(&db)
                        })
                        .expect("lo ≤ hi when F ≤ the number of parameters");
                    starts.push(best);
                }
                starts.push(n_params);
                starts.windows(2).map(|w| (w[0]..w[1]).collect()).collect()
            }
        }
    }
}

/// The values of `flat` in `ranges`, in order.
pub(super) fn gather(ranges: &[Range<usize>], flat: &Tensor<1>) -> Tensor<1> {
    let parts: Vec<Tensor<1>> = ranges
        .iter()
        .map(|r| flat.clone().narrow(0, r.start, r.len()))
        .collect();
    Tensor::cat(parts, 0)
}

/// `flat` with its elements in `ranges` replaced by `values` (as [`gather`] orders them).
pub(super) fn scatter(ranges: &[Range<usize>], flat: Tensor<1>, values: Tensor<1>) -> Tensor<1> {
    let n = flat.shape().num_elements();
    let mut parts = Vec::with_capacity(2 * ranges.len() + 1);
    let (mut at, mut taken) = (0, 0);
    for r in ranges {
        if r.start > at {
            parts.push(flat.clone().narrow(0, at, r.start - at));
        }
        parts.push(values.clone().narrow(0, taken, r.len()));
        taken += r.len();
        at = r.end;
    }
    if at < n {
        parts.push(flat.narrow(0, at, n - at));
    }
    Tensor::cat(parts, 0)
}
