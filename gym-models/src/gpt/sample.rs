//! Sampling from a [`Gpt`]: [`SamplingConfig`], [`Gpt::generate`] and [`sample_logits`].

use super::{Gpt, GptError};
use burn::config::Config;
use burn::module::Module;
use burn::tensor::module::linear;
use burn::tensor::{Int, Tensor, TensorData};
use rand::Rng;

/// How [`Gpt::generate`] picks tokens.
#[derive(Config, Debug)]
pub struct SamplingConfig {
    /// Tokens to generate.
    pub max_new_tokens: usize,
    /// Divides the logits: below 1 sharpens, above 1 flattens; 0 picks the most likely
    /// token (greedy).
    #[config(default = 1.0)]
    pub temperature: f64,
    /// Sample among the `k` most likely tokens only.
    #[config(default = "None")]
    pub top_k: Option<usize>,
}

impl SamplingConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), GptError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(GptError::InvalidSampling(format!(
                "temperature {} must be a finite number ≥ 0",
                self.temperature
            )));
        }
        if self.top_k == Some(0) {
            return Err(GptError::InvalidSampling("top_k must be at least 1".into()));
        }
        Ok(())
    }
}

impl Gpt {
    /// Continues `prompt` by `sampling.max_new_tokens` tokens, feeding each sampled token
    /// back in (the context cropped to the last `block_size` tokens), and returns the new
    /// tokens. Runs without autodiff and dropout.
    pub fn generate(
        &self,
        prompt: &[u32],
        sampling: &SamplingConfig,
        rng: &mut impl Rng,
    ) -> Result<Vec<u32>, GptError> {
        sampling.validate()?;
        if prompt.is_empty() {
            return Err(GptError::EmptyPrompt);
        }
        let vocab_size = self.config.vocab_size;
        if let Some((position, &token)) = prompt
            .iter()
            .enumerate()
            .find(|&(_, &t)| t as usize >= vocab_size)
        {
            return Err(GptError::TokenOutOfRange {
                token,
                position,
                vocab_size,
            });
        }
        let model = self.valid();
        let mut tokens = prompt.to_vec();
        for _ in 0..sampling.max_new_tokens {
            let context = &tokens[tokens.len().saturating_sub(self.config.block_size)..];
            let logits = model.next_token_logits(context);
            tokens.push(sample_logits(
                &logits,
                sampling.temperature,
                sampling.top_k,
                rng,
            ));
        }
        Ok(tokens.split_off(prompt.len()))
    }

    /// The logits of the token after `context` (1 to `block_size` tokens).
    fn next_token_logits(&self, context: &[u32]) -> Vec<f32> {
        let t = context.len();
        let ids: Vec<i64> = context.iter().map(|&x| x as i64).collect();
        let device = self.wte.weight.device();
        let idx = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, t]), &device);
        // Only the last position is needed: project just it through the head.
        let last = self.hidden(idx).narrow(1, t - 1, 1);
        linear(last, self.wte.weight.val().transpose(), None)
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .expect("f32 logits")
    }
}

/// Picks a token from next-token `logits` as nanoGPT's `generate`: divide by `temperature`,
/// keep the `top_k` largest (ties with the k-th kept), softmax, sample. A temperature of 0
/// (or `top_k = 1`) returns the arg-max (the first, on ties).
pub fn sample_logits(
    logits: &[f32],
    temperature: f64,
    top_k: Option<usize>,
    rng: &mut impl Rng,
) -> u32 {
    let argmax = || {
        let mut best = 0;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] {
                best = i;
            }
        }
        best as u32
    };
    if temperature <= 0.0 || top_k == Some(1) {
        return argmax();
    }
    let mut scaled: Vec<f64> = logits.iter().map(|&l| l as f64 / temperature).collect();
    if let Some(k) = top_k.filter(|&k| k < scaled.len()) {
        let mut sorted = scaled.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[k - 1];
        for s in &mut scaled {
            if *s < kth {
                *s = f64::NEG_INFINITY;
            }
        }
    }
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        // Overflowing scores (a tiny temperature): the limit is the arg-max.
        return argmax();
    }
    let weights: Vec<f64> = scaled.iter().map(|s| (s - max).exp()).collect();
    let mut u = rng.random::<f64>() * weights.iter().sum::<f64>();
    for (i, w) in weights.iter().enumerate() {
        if u < *w {
            return i as u32;
        }
        u -= w;
    }
    // Rounding left u just above the total: the last token with weight.
    weights.iter().rposition(|&w| w > 0.0).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn top_k_never_picks_outside_the_k_largest() {
        let logits = [0.0f32, 3.0, 1.0, 2.9, -1.0];
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut seen = [0usize; 5];
        for _ in 0..2000 {
            seen[sample_logits(&logits, 2.0, Some(2), &mut rng) as usize] += 1;
        }
        assert_eq!(seen[0] + seen[2] + seen[4], 0);
        // exp(1.5) vs exp(1.45): nearly even.
        assert!(seen[1] > 800 && seen[3] > 800, "{seen:?}");
    }
}
