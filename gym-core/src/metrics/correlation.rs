//! How far the replicas have drifted apart (spec §2.9).

/// Mean pairwise Pearson correlation of `replicas` (each a flattened model), as the
/// original's `np.corrcoef` over every pair `i < j`. Identical replicas give exactly 1.0;
/// a constant replica has no correlation (NaN), as in NumPy. Needs two replicas or more
/// of equal, non-zero length (`NaN` otherwise).
pub fn mean_pairwise_correlation(replicas: &[Vec<f32>]) -> f64 {
    let k = replicas.len();
    let n = replicas.first().map_or(0, Vec::len);
    if k < 2 || n == 0 || replicas.iter().any(|r| r.len() != n) {
        return f64::NAN;
    }
    // Centred copies in f64; every variance and covariance is summed in the same order,
    // so for identical replicas cov == var bit for bit and cov / sqrt(var·var) == 1.
    let centred: Vec<Vec<f64>> = replicas
        .iter()
        .map(|r| {
            let mean = r.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
            r.iter().map(|&x| f64::from(x) - mean).collect()
        })
        .collect();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let var: Vec<f64> = centred.iter().map(|c| dot(c, c)).collect();
    let mut sum = 0.0;
    for i in 0..k {
        for j in i + 1..k {
            sum += dot(&centred[i], &centred[j]) / (var[i] * var[j]).sqrt();
        }
    }
    sum / (k * (k - 1) / 2) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// numpy.corrcoef's formula, written out naively for one pair.
    fn pearson(x: &[f32], y: &[f32]) -> f64 {
        let n = x.len() as f64;
        let mx = x.iter().map(|&v| v as f64).sum::<f64>() / n;
        let my = y.iter().map(|&v| v as f64).sum::<f64>() / n;
        let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
        for (&a, &b) in x.iter().zip(y) {
            let (a, b) = (a as f64 - mx, b as f64 - my);
            sxy += a * b;
            sxx += a * a;
            syy += b * b;
        }
        sxy / (sxx.sqrt() * syy.sqrt())
    }

    #[test]
    fn correlation_is_the_mean_over_pairs_of_pearson() {
        let a = vec![1.0, 2.0, 3.0, 4.0];
        // Affine images correlate perfectly, reversed ones anti-correlate.
        let b: Vec<f32> = a.iter().map(|x| 2.0 * x + 1.0).collect();
        let c: Vec<f32> = a.iter().map(|x| -x).collect();
        assert!((mean_pairwise_correlation(&[a.clone(), b.clone()]) - 1.0).abs() < 1e-12);
        assert!((mean_pairwise_correlation(&[a.clone(), c.clone()]) + 1.0).abs() < 1e-12);
        // Three replicas: (1 − 1 − 1) / 3.
        let three = mean_pairwise_correlation(&[a.clone(), b.clone(), c.clone()]);
        assert!((three + 1.0 / 3.0).abs() < 1e-12, "{three}");
        // Against the naive formula on uneven values.
        let x = vec![0.3, -1.2, 5.0, 0.0, 2.5, -0.7];
        let y = vec![0.1, -1.0, 4.0, 0.4, 2.0, 0.3];
        let z = vec![-2.0, 0.5, 0.1, 3.0, -1.0, 0.0];
        let expected = (pearson(&x, &y) + pearson(&x, &z) + pearson(&y, &z)) / 3.0;
        let got = mean_pairwise_correlation(&[x.clone(), y, z]);
        assert!((got - expected).abs() < 1e-12, "{got} vs {expected}");
        // Identical replicas: exactly one, whatever the values.
        let w: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1013) as f32 * 1e-3 - 0.4)
            .collect();
        assert_eq!(mean_pairwise_correlation(&[w.clone(), w.clone(), w]), 1.0);
        // Undefined cases.
        assert!(mean_pairwise_correlation(std::slice::from_ref(&x)).is_nan());
        assert!(mean_pairwise_correlation(&[vec![1.0; 4], a]).is_nan());
        assert!(mean_pairwise_correlation(&[x, vec![1.0]]).is_nan());
    }
}
