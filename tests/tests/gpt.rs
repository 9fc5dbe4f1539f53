//! nanoGPT: the model's structure checked against closed forms and naive references, the
//! character data on tiny-shakespeare, and a short distributed run.

use burn::data::dataset::Dataset;
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::{Device, Int, Tensor, TensorData};
use gym_core::{NodeData, ParamLayout, Trainer, TrainerConfig};
use gym_data::{CharCorpus, CharVocab, DataError, TokenBatcher, TokenWindows};
use gym_models::{Gpt, GptConfig, GptError, GptSize, SamplingConfig};
use gym_strategies::{AllReduceConfig, DiLoCoCommunicatorConfig, DiLoCoConfig};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;
use std::sync::Arc;
use tests::shared_data;

const VOCAB: usize = 11;
const BLOCK: usize = 8;

/// Burn's CPU backend draws initial weights from one process-wide generator: every test
/// builds its model under the lock `Trainer::fit` holds, so its draws cannot interleave
/// with another test's (a `fit` in this binary checks its bits).
fn seeded(device: &Device, seed: u64, config: GptConfig) -> Gpt {
    gym_core::rng::init_seeded(device, seed, |d| config.init(d).unwrap())
}

fn tiny_seeded(device: &Device, seed: u64) -> Gpt {
    seeded(
        device,
        seed,
        GptConfig::new(VOCAB, BLOCK)
            .with_n_layer(2)
            .with_n_head(2)
            .with_n_embd(16),
    )
}

fn tiny(device: &Device) -> Gpt {
    tiny_seeded(device, 5)
}

fn ids(rows: &[&[i64]], device: &Device) -> Tensor<2, Int> {
    let t = rows[0].len();
    let flat: Vec<i64> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), t]), device)
}

fn values(t: Tensor<3>) -> (Vec<f32>, [usize; 3]) {
    let dims = t.dims();
    (t.into_data().try_to_vec::<f32>().unwrap(), dims)
}

/// The nanoGPT parameter count, written out layer by layer: the LayerNorms (gain + bias),
/// c_attn (d → 3d), the attention c_proj (d → d), c_fc (d → 4d), the MLP c_proj (4d → d),
/// all with biases; the token embedding (which is also the head); the final LayerNorm.
fn nanogpt_formula(vocab: usize, n_layer: usize, d: usize) -> usize {
    let ln = 2 * d;
    let attn = (d * 3 * d + 3 * d) + (d * d + d);
    let mlp = (d * 4 * d + 4 * d) + (4 * d * d + d);
    vocab * d + n_layer * (2 * ln + attn + mlp) + ln
}

/// Asserts that positions `< changed_from` of `model`'s logits are the same for two inputs
/// that differ from `changed_from` on, and that later positions differ. `before_each` runs
/// before each forward pass.
fn assert_causal(model: &Gpt, device: &Device, before_each: impl Fn()) {
    let changed_from = 4;
    let a = ids(
        &[&[1, 2, 3, 4, 5, 6, 7, 8], &[9, 9, 0, 1, 2, 3, 4, 5]],
        device,
    );
    let b = ids(
        &[&[1, 2, 3, 4, 0, 0, 10, 3], &[9, 9, 0, 1, 7, 7, 7, 7]],
        device,
    );
    before_each();
    let (la, [_, t, v]) = values(model.forward(a));
    before_each();
    let (lb, _) = values(model.forward(b));
    for row in 0..2 {
        for pos in 0..t {
            let at = |l: &[f32]| l[(row * t + pos) * v..(row * t + pos + 1) * v].to_vec();
            if pos < changed_from {
                assert_eq!(at(&la), at(&lb), "row {row}, position {pos} saw the future");
            } else {
                assert_ne!(
                    at(&la),
                    at(&lb),
                    "row {row}, position {pos} ignores its input"
                );
            }
        }
    }
}

#[test]
fn the_output_at_t_does_not_depend_on_later_tokens() {
    // Inference: the backend's fused attention.
    let device = Device::default();
    assert_causal(&tiny(&device), &device, || {});
    // Training (autodiff), with dropout: the written-out attention. Reseeding the node's
    // stream gives both passes the same dropout masks.
    let device = Device::default().autodiff();
    let model = seeded(
        &device,
        5,
        GptConfig::new(VOCAB, BLOCK)
            .with_n_layer(2)
            .with_n_head(2)
            .with_n_embd(16)
            .with_dropout(0.3),
    );
    assert_causal(&model, &device, || gym_core::rng::seed_node(3, 0));
}

#[test]
fn training_and_inference_forward_passes_agree_without_dropout() {
    let device = Device::default();
    let model = tiny(&device);
    let trained = model.clone().fork(&device.clone().autodiff());
    let input = ids(&[&[1, 2, 3, 4, 5, 6, 7, 8]], &device);
    let (a, _) = values(model.forward(input.clone()));
    let (b, _) = values(trained.forward(input.clone().autodiff()).inner());
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    assert!(diff < 1e-5, "max difference {diff}");
}

/// Every float parameter's id and shape.
#[derive(Default)]
struct Shapes(Vec<(ParamId, Vec<usize>)>);

impl ModuleVisitor for Shapes {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
        self.0.push((p.id, p.val().dims().to_vec()));
    }
}

/// Zeroes row `row` of every `[VOCAB, ·]` matrix.
struct ZeroVocabRow(usize);

impl ModuleMapper for ZeroVocabRow {
    fn map_float<const D: usize>(&mut self, p: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let row = self.0;
        p.map(|t| {
            let dims = t.dims();
            if D == 2 && dims[0] == VOCAB {
                let mut mask = vec![1.0f32; dims.iter().product()];
                mask[row * dims[1]..(row + 1) * dims[1]].fill(0.0);
                let mask = Tensor::<D>::from_data(TensorData::new(mask, dims), &t.device());
                t * mask
            } else {
                t
            }
        })
    }
}

#[test]
fn the_lm_head_is_the_token_embedding() {
    let device = Device::default();
    let model = tiny(&device);
    let mut shapes = Shapes::default();
    model.visit(&mut shapes);
    let unique: HashSet<ParamId> = shapes.0.iter().map(|(id, _)| *id).collect();
    assert_eq!(unique.len(), shapes.0.len(), "a parameter is visited twice");
    let vocab_sized: Vec<_> = shapes
        .0
        .iter()
        .filter(|(_, s)| s.contains(&VOCAB))
        .collect();
    assert_eq!(vocab_sized.len(), 1, "one matrix with a vocabulary axis");
    assert_eq!(vocab_sized[0].1, vec![VOCAB, 16]);
    // No separate head: the trainable count is the formula (with wpe), counting wte once.
    let trainable = tiny(&device.clone().autodiff());
    assert_eq!(
        ParamLayout::trainable(&trainable).num_elements(),
        nanogpt_formula(VOCAB, 2, 16) + BLOCK * 16
    );
    // Zeroing token 3's embedding row zeroes its logit everywhere: the head reads it.
    let model = model.map(&mut ZeroVocabRow(3));
    let (logits, [b, t, v]) = values(model.forward(ids(&[&[1, 2, 4, 5, 6, 7, 8, 9]], &device)));
    for pos in 0..b * t {
        assert_eq!(logits[pos * v + 3], 0.0);
        assert_ne!(logits[pos * v + 4], 0.0);
    }
}

#[test]
fn the_small_preset_has_nanogpts_parameter_count() {
    // Autodiff, so the parameters count as trainable.
    let device = Device::default().autodiff();
    let model = seeded(&device, 0, GptConfig::preset(GptSize::Small, 65, 64));
    let expected = nanogpt_formula(65, 4, 128);
    assert_eq!(expected, 801_664);
    assert_eq!(model.num_params_non_embedding(), expected);
    assert_eq!(model.config().num_params(), expected);
    assert_eq!(
        ParamLayout::trainable(&model).num_elements(),
        expected + 64 * 128
    );
    // The original's table, at its vocabulary of 66 and block size 1024: 0.80M / 0.93M.
    let original = GptConfig::preset(GptSize::Small, 66, 1024);
    assert_eq!(original.num_params(), 801_792);
    assert_eq!(original.num_params() + 1024 * 128, 932_864);
}

#[test]
fn the_initialisation_follows_nanogpt() {
    let device = Device::default();
    let model = seeded(&device, 1, GptConfig::preset(GptSize::Small, 65, 64));
    let mut stats = Vec::new();
    struct Std<'a>(&'a mut Vec<(Vec<usize>, f64, f64)>);
    impl ModuleVisitor for Std<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let v: Vec<f32> = p.val().into_data().try_to_vec::<f32>().unwrap();
            let n = v.len() as f64;
            let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
            let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
            self.0.push((p.val().dims().to_vec(), mean, var.sqrt()));
        }
    }
    model.visit(&mut Std(&mut stats));
    let scaled = 0.02 / (2.0f64 * 4.0).sqrt();
    let (mut plain, mut residual) = (0, 0);
    for (shape, mean, std) in &stats {
        match shape.as_slice() {
            [_, _] if shape == &[128, 128] || shape == &[512, 128] => {
                assert!((std - scaled).abs() < 0.1 * scaled, "c_proj std {std}");
                residual += 1;
            }
            [_, _] => {
                assert!((std - 0.02).abs() < 0.002, "{shape:?} std {std}");
                plain += 1;
            }
            [128] => assert!(*std == 0.0 && (*mean == 0.0 || *mean == 1.0)),
            [_] => assert_eq!((*mean, *std), (0.0, 0.0), "{shape:?} bias"),
            _ => panic!("unexpected shape {shape:?}"),
        }
    }
    // wte, wpe and 4 × (c_attn, c_fc); 4 × 2 residual projections.
    assert_eq!((plain, residual), (10, 8));
}

/// Greedy decoding written naively: the full forward pass on the cropped context, then
/// the first maximum of the last position's logits.
fn naive_greedy(model: &Gpt, prompt: &[u32], n: usize, device: &Device) -> Vec<u32> {
    let mut tokens = prompt.to_vec();
    for _ in 0..n {
        let ctx: Vec<i64> = tokens[tokens.len().saturating_sub(BLOCK)..]
            .iter()
            .map(|&x| x as i64)
            .collect();
        let (logits, [_, t, v]) = values(model.forward(ids(&[&ctx], device)));
        let last = &logits[(t - 1) * v..t * v];
        let mut best = 0;
        for i in 1..v {
            if last[i] > last[best] {
                best = i;
            }
        }
        tokens.push(best as u32);
    }
    tokens.split_off(prompt.len())
}

#[test]
fn sampling_at_temperature_zero_is_greedy_argmax() {
    let device = Device::default();
    let model = tiny(&device);
    let prompt = [3, 1, 4];
    // Longer than the block, so the context cropping is exercised too.
    let expected = naive_greedy(&model, &prompt, 12, &device);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    for temperature in [0.0, 1e-9] {
        let sampling = SamplingConfig::new(12).with_temperature(temperature);
        assert_eq!(
            model.generate(&prompt, &sampling, &mut rng).unwrap(),
            expected
        );
    }
    // At temperature 1 sampling is not greedy, and it is reproducible from the seed.
    let sampling = SamplingConfig::new(40).with_top_k(Some(5));
    let a = model
        .generate(&prompt, &sampling, &mut ChaCha8Rng::seed_from_u64(1))
        .unwrap();
    let b = model
        .generate(&prompt, &sampling, &mut ChaCha8Rng::seed_from_u64(1))
        .unwrap();
    assert_eq!(a, b);
    assert_ne!(a, naive_greedy(&model, &prompt, 40, &device));
    // Bad input is a typed error.
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    assert!(matches!(
        model.generate(&[], &sampling, &mut rng),
        Err(GptError::EmptyPrompt)
    ));
    assert!(matches!(
        model.generate(&[1, 11], &sampling, &mut rng),
        Err(GptError::TokenOutOfRange {
            token: 11,
            position: 1,
            ..
        })
    ));
    assert!(matches!(
        model.generate(
            &[1],
            &SamplingConfig::new(1).with_temperature(-1.0),
            &mut rng
        ),
        Err(GptError::InvalidSampling(_))
    ));
}

#[test]
fn a_saved_model_loads_back_with_the_same_logits() {
    let device = Device::default();
    let model = tiny(&device);
    let dir = std::env::temp_dir().join(format!("gym-gpt-record-{}", std::process::id()));
    model.save(&dir).unwrap();
    let input = ids(&[&[1, 2, 3, 4, 5, 6, 7, 8]], &device);
    let loaded = Gpt::load(&dir, &device).unwrap();
    assert_eq!(loaded.config(), model.config());
    assert_eq!(
        values(loaded.forward(input.clone())),
        values(model.forward(input.clone()))
    );
    // A different model gives different logits, so the comparison above can fail.
    let other = tiny_seeded(&device, 99);
    assert_ne!(
        values(other.forward(input.clone())).0,
        values(model.forward(input)).0
    );
    // A corrupt record and a missing folder are typed errors.
    std::fs::write(dir.join(gym_models::gpt::MODEL_FILE), b"not a record").unwrap();
    assert!(matches!(
        Gpt::load(&dir, &device),
        Err(GptError::Record { action: "read", .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(matches!(
        Gpt::load(&dir, &device),
        Err(GptError::Record { .. })
    ));
}

fn shakespeare() -> CharCorpus {
    CharCorpus::load(&shared_data("shakespeare").join("input.txt")).unwrap()
}

#[test]
fn tiny_shakespeare_splits_into_windows_and_contiguous_shards() {
    let corpus = shakespeare();
    assert_eq!(corpus.tokens().len(), 1_115_394);
    let vocab = corpus.vocab();
    assert_eq!(vocab.len(), 65);
    assert_eq!(vocab.chars()[0], '\n');
    assert_eq!(vocab.chars()[1], ' ');
    assert_eq!(
        vocab.decode(&corpus.tokens()[..14]).unwrap(),
        "First Citizen:"
    );

    let (train, val) = corpus.split(64, 0.1).unwrap();
    // nanoGPT: the first 90% trains. Train windows at every position, validation side by side.
    assert_eq!(train.tokens().len(), 1_003_854);
    assert_eq!(val.tokens().len(), 111_540);
    assert_eq!(train.len(), 1_003_854 - 64);
    assert_eq!(val.len(), (111_540 - 65) / 64 + 1);
    assert_eq!(&train.get(5).unwrap().tokens[..], &corpus.tokens()[5..70]);
    assert_eq!(
        &val.get(2).unwrap().tokens[..],
        &corpus.tokens()[1_003_854 + 128..1_003_854 + 193]
    );

    // Four contiguous shards, in order, covering the train range exactly.
    let shards: Vec<TokenWindows> = (0..4).map(|r| train.shard(r, 4).unwrap()).collect();
    let joined: Vec<u32> = shards.iter().flat_map(|s| s.tokens().to_vec()).collect();
    assert_eq!(joined, train.tokens());
    for s in &shards {
        assert!((250_963..=250_964).contains(&s.tokens().len()));
        assert_eq!(s.len(), s.tokens().len() - 64);
        assert_eq!(s.get(0).unwrap().tokens, s.tokens()[..65]);
    }
    assert!(matches!(
        train.shard(4, 4),
        Err(DataError::InvalidArgument(_))
    ));
    assert!(matches!(
        corpus.split(64, 1.0),
        Err(DataError::InvalidArgument(_))
    ));
    assert!(matches!(
        corpus.split(200_000, 0.1),
        Err(DataError::TooShort { .. })
    ));
    let short: Arc<[u32]> = corpus.tokens()[..300].into();
    let short = TokenWindows::new(short, 64, 1).unwrap();
    assert!(matches!(short.shard(0, 8), Err(DataError::TooShort { .. })));
}

#[test]
fn the_vocabulary_round_trips_through_json_and_rejects_unknown_characters() {
    let corpus = shakespeare();
    let vocab = corpus.vocab();
    let text = "ROMEO:\nWhat light through yonder window breaks?\n";
    let encoded = vocab.encode(text).unwrap();
    assert_eq!(vocab.decode(&encoded).unwrap(), text);
    let path = std::env::temp_dir().join(format!("gym-vocab-{}.json", std::process::id()));
    vocab.save(&path).unwrap();
    let loaded = CharVocab::load(&path).unwrap();
    assert_eq!(&loaded, vocab);
    assert_eq!(loaded.encode(text).unwrap(), encoded);
    std::fs::write(&path, r#"{"kind": "char", "chars": ["a", "bc"]}"#).unwrap();
    assert!(matches!(
        CharVocab::load(&path),
        Err(DataError::Format { .. })
    ));
    std::fs::write(&path, r#"{"kind": "char", "chars": ["a", "a"]}"#).unwrap();
    assert!(matches!(
        CharVocab::load(&path),
        Err(DataError::Format { .. })
    ));
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        CharVocab::load(&path),
        Err(DataError::Missing { .. })
    ));
    assert!(matches!(
        vocab.encode("ROMEO: ¿"),
        Err(DataError::UnknownChar {
            ch: '¿',
            position: 7,
            ..
        })
    ));
    assert!(matches!(
        vocab.decode(&[65]),
        Err(DataError::UnknownToken { id: 65, .. })
    ));
    assert!(matches!(
        CharCorpus::load(std::path::Path::new("/nonexistent/input.txt")),
        Err(DataError::Missing { .. })
    ));
}

fn short_run(data: &NodeData<gym_data::TokenWindow>, diloco: bool, seed: u64) -> (f64, Vec<u32>) {
    let config = TrainerConfig::new(2)
        .with_max_steps(Some(30))
        .with_batch_size(8)
        .with_val_size(Some(0))
        .with_seed(seed);
    let init = |d: &Device| {
        GptConfig::new(65, 16)
            .with_n_layer(1)
            .with_n_head(2)
            .with_n_embd(32)
            .with_dropout(0.1)
            .init(d)
            .unwrap()
    };
    let inner = gym_core::InnerOptimizerConfig::new().with_lr(3e-3);
    let trainer = Trainer::new(config);
    let out = if diloco {
        let strategy = DiLoCoConfig::new()
            .with_inner(inner)
            .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(10));
        trainer.fit(init, &strategy, data, &TokenBatcher)
    } else {
        trainer.fit(
            init,
            &AllReduceConfig::new().with_inner(inner),
            data,
            &TokenBatcher,
        )
    }
    .unwrap();
    let flat = ParamLayout::trainable(&out.model)
        .flatten(&out.model)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    let loss = out.report.final_validation().unwrap().global_loss;
    (loss, flat.iter().map(|x| x.to_bits()).collect())
}

#[test]
fn a_small_gpt_learns_shakespeare_on_two_nodes_reproducibly() {
    let corpus = shakespeare();
    // A slice of the text keeps the final whole-validation evaluation short.
    let tokens: Arc<[u32]> = corpus.tokens()[..60_000].into();
    let n_train = 54_000;
    let train = TokenWindows::over(tokens.clone(), 0..n_train, 16, 1).unwrap();
    let val = TokenWindows::over(tokens, n_train..60_000, 16, 16).unwrap();
    let uniform = (65f64).ln();
    let shared = TokenWindows::shared(train.clone(), val.clone());
    let (loss, bits) = short_run(&shared, false, 7);
    assert!(loss < uniform - 0.8, "AllReduce val loss {loss}");
    assert_eq!(short_run(&shared, false, 7).1, bits, "same seed, same bits");
    let per_node = TokenWindows::per_node(train, val);
    let (loss, _) = short_run(&per_node, true, 7);
    assert!(loss < uniform - 0.8, "DiLoCo on shards val loss {loss}");
}
