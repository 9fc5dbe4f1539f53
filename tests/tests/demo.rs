//! DeMo against the original implementation's recorded vectors and against closed forms.
//!
//! The vectors file is read from `$DEMO_VECTORS`, by default the shared
//! `reference/demo-vectors.json` (format: `demo-vectors-FORMAT.md` beside it). Every case in
//! the file is checked, whatever its number of ranks, parameter shapes and configuration.

use burn::module::{Module, Param};
use burn::tensor::{Device, Tensor, TensorData};
use gym_core::{
    InProcessGroup, LrScheduleConfig, ModelReplica, NodeInfo, ParamLayout, Replica, StepContext,
    Strategy, StrategyConfig,
};
use gym_strategies::demo::codec::IndexWidth;
use gym_strategies::demo::dct::{ChunkGrid, Dct, chunk_size};
use gym_strategies::{DeMo, DeMoConfig};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn vectors_path() -> PathBuf {
    std::env::var_os("DEMO_VECTORS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../shared/reference/demo-vectors.json")
        })
}

fn load_vectors() -> Value {
    let path = vectors_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read the DeMo vectors at {} ({e}); set DEMO_VECTORS",
            path.display()
        )
    });
    let v: Value = serde_json::from_str(&text).expect("the vectors file is JSON");
    assert_eq!(v["format"], "demo-vectors", "not a demo-vectors file");
    v
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("integer") as usize)
        .collect()
}

/// Parameters of any shape (1 to 4 dimensions), in a module Burn can flatten.
#[derive(Module, Debug)]
struct Tensors {
    d1: Vec<Param<Tensor<1>>>,
    d2: Vec<Param<Tensor<2>>>,
    d3: Vec<Param<Tensor<3>>>,
    d4: Vec<Param<Tensor<4>>>,
}

impl Tensors {
    /// The module holding `values[i]` with `shapes[i]`, and for each of its parameters in
    /// layout order, the index of the input it came from.
    fn new(shapes: &[Vec<usize>], values: &[Vec<f32>], device: &Device) -> (Self, Vec<usize>) {
        let mut t = Tensors {
            d1: vec![],
            d2: vec![],
            d3: vec![],
            d4: vec![],
        };
        let data = |i: usize| TensorData::new(values[i].clone(), shapes[i].clone());
        let mut order = vec![];
        for rank in 1..=4 {
            for (i, shape) in shapes.iter().enumerate() {
                if shape.len() != rank {
                    continue;
                }
                order.push(i);
                match rank {
                    1 => {
                        t.d1.push(Param::from_tensor(Tensor::from_data(data(i), device)))
                    }
                    2 => {
                        t.d2.push(Param::from_tensor(Tensor::from_data(data(i), device)))
                    }
                    3 => {
                        t.d3.push(Param::from_tensor(Tensor::from_data(data(i), device)))
                    }
                    _ => {
                        t.d4.push(Param::from_tensor(Tensor::from_data(data(i), device)))
                    }
                }
            }
        }
        assert_eq!(order.len(), shapes.len(), "shapes of 1 to 4 dimensions");
        (t, order)
    }
}

fn host(t: Tensor<1>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

/// What DeMo is told of node `rank` of `world_size`, training `model` for `max_steps`.
fn node_info<'a>(
    rank: usize,
    world_size: usize,
    max_steps: usize,
    device: &'a Device,
    layout: &'a ParamLayout,
    model: &Tensors,
) -> NodeInfo<'a> {
    NodeInfo {
        rank,
        world_size,
        max_steps,
        seed: 0,
        device,
        layout,
        initial_params: layout.flatten(model),
        node_speeds: &[1.0; 64][..world_size],
        faults: false,
    }
}

/// What one rank observed after one step, per parameter in the file's order.
struct Observed {
    params: Vec<Vec<f32>>,
    delta: Vec<Vec<f32>>,
    sent: Vec<(Vec<u32>, Vec<f32>, usize)>,
    bytes_sent: u64,
    bytes_received: u64,
    payload: usize,
}

/// Runs one case of the file on K in-process ranks with [`DeMo`] as the strategy.
fn run_case(case: &Value) -> Vec<Vec<Observed>> {
    let k = case["num_ranks"].as_u64().unwrap() as usize;
    let cfg = &case["config"];
    let config = DeMoConfig::new()
        .with_lr(cfg["lr"].as_f64().unwrap())
        .with_compression_decay(cfg["compression_decay"].as_f64().unwrap())
        .with_compression_topk(cfg["compression_topk"].as_u64().unwrap() as usize)
        .with_compression_chunk(cfg["compression_chunk"].as_u64().unwrap() as usize)
        .with_weight_decay(cfg["weight_decay"].as_f64().unwrap())
        .with_schedule(LrScheduleConfig::new());
    let params = case["params"].as_array().unwrap();
    let shapes: Vec<Vec<usize>> = params.iter().map(|p| usizes(&p["shape"])).collect();
    let init: Vec<Vec<f32>> = params.iter().map(|p| floats(&p["init"])).collect();
    let steps = case["steps"].as_array().unwrap();
    let device = Device::default().autodiff();

    InProcessGroup::new(k)
        .run(|comm| {
            let rank = comm.rank();
            let (model, order) = Tensors::new(&shapes, &init, &device);
            let layout = ParamLayout::trainable(&model);
            assert_eq!(layout.entries().len(), shapes.len());
            let info = node_info(rank, k, steps.len(), &device, &layout, &model);
            let mut demo = DeMo::new(&config, &info).unwrap();
            let mut replica = ModelReplica::new(model, layout.clone());
            let mut observed = vec![];
            for (i, step) in steps.iter().enumerate() {
                let mut grads = vec![0.0; layout.num_elements()];
                for (entry, &p) in layout.entries().iter().zip(&order) {
                    let g = floats(&step["grads"][rank][p]);
                    grads[entry.offset..entry.offset + entry.numel].copy_from_slice(&g);
                }
                let before = comm.stats();
                let mut ctx = StepContext {
                    rank,
                    world_size: k,
                    step: i,
                    max_steps: steps.len(),
                    replica: &mut replica,
                    collective: &comm,
                    layout: &layout,
                };
                let g = Tensor::from_data(
                    TensorData::new(grads, [layout.num_elements()]),
                    &device.clone().inner(),
                );
                demo.step(g, &mut ctx).unwrap();
                let after = comm.stats();
                let flat = host(replica.params());
                let mut obs = Observed {
                    params: vec![vec![]; shapes.len()],
                    delta: vec![vec![]; shapes.len()],
                    sent: vec![(vec![], vec![], 0); shapes.len()],
                    bytes_sent: after.bytes_sent - before.bytes_sent,
                    bytes_received: after.bytes_received - before.bytes_received,
                    payload: demo.payload_bytes(),
                };
                for (li, (entry, &p)) in layout.entries().iter().zip(&order).enumerate() {
                    obs.params[p] = flat[entry.offset..entry.offset + entry.numel].to_vec();
                    obs.delta[p] = demo.delta(li);
                    let s = demo.last_sent(li);
                    obs.sent[p] = (s.indices.clone(), s.values.clone(), s.k);
                }
                observed.push(obs);
            }
            observed
        })
        .unwrap()
        .into_iter()
        .map(|r| r.expect("rank finished"))
        .collect()
}

#[test]
fn reproduces_the_original_demo_vectors() {
    let v = load_vectors();
    let cases = v["cases"].as_array().unwrap();
    assert!(!cases.is_empty(), "the file holds no case");
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let k = case["num_ranks"].as_u64().unwrap() as usize;
        let chunk = case["config"]["compression_chunk"].as_u64().unwrap() as usize;
        let topk = case["config"]["compression_topk"].as_u64().unwrap() as usize;
        let params = case["params"].as_array().unwrap();
        let observed = run_case(case);
        for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            let at = |r: usize, p: usize| format!("{name}, step {}, rank {r}, param {p}", i + 1);
            let mut original_payload = 0;
            let mut our_payload = 0;
            for (p, param) in params.iter().enumerate() {
                let shape = usizes(&param["shape"]);
                let grid = ChunkGrid::new(&shape, chunk);
                let chunk_dims = usizes(&param["chunk_dims"]);
                assert_eq!(
                    chunk_dims,
                    shape
                        .iter()
                        .map(|&n| chunk_size(n, chunk))
                        .collect::<Vec<_>>(),
                    "{name}: chunk dims of param {p}"
                );
                // Parameters: every element moves by exactly ±lr or 0 after the decay.
                let expected = floats(&step["params_after"][p]);
                for (r, obs) in observed.iter().enumerate() {
                    let err = obs[i].params[p]
                        .iter()
                        .zip(&expected)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0, f32::max);
                    assert!(err <= 1e-6, "{}: parameters off by {err}", at(r, p));
                }
                for (r, obs) in observed.iter().enumerate() {
                    // The error-feedback buffer, relative to its largest element.
                    let expected = floats(&step["delta_after"][r][p]);
                    let scale = expected.iter().map(|x| x.abs()).fold(0.0, f32::max);
                    let err = obs[i].delta[p]
                        .iter()
                        .zip(&expected)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0, f32::max);
                    assert!(
                        err <= 1e-5 * scale,
                        "{}: delta off by {err} (max {scale})",
                        at(r, p)
                    );

                    // The sent coefficients: the same index set in every chunk, same values.
                    let sparse = &step["sparse"][r][p];
                    let idx = usizes(&sparse["idx"]);
                    let val = floats(&sparse["val"]);
                    let idx_shape = usizes(&sparse["idx_shape"]);
                    let k_sent = *idx_shape.last().unwrap();
                    let (our_idx, our_val, our_k) = &obs[i].sent[p];
                    assert_eq!(*our_k, k_sent, "{}: k", at(r, p));
                    assert_eq!(our_idx.len(), idx.len(), "{}: number sent", at(r, p));
                    let vscale = val.iter().map(|x| x.abs()).fold(0.0, f32::max);
                    for c in 0..idx.len() / k_sent {
                        let range = c * k_sent..(c + 1) * k_sent;
                        let theirs: BTreeSet<usize> = idx[range.clone()].iter().copied().collect();
                        let ours: BTreeSet<usize> =
                            our_idx[range.clone()].iter().map(|&x| x as usize).collect();
                        assert_eq!(ours, theirs, "{}: index set of chunk {c}", at(r, p));
                        for j in range.clone() {
                            let o = range
                                .clone()
                                .find(|&o| our_idx[o] as usize == idx[j])
                                .unwrap();
                            assert!(
                                (our_val[o] - val[j]).abs() <= 1e-5 * vscale,
                                "{}: value of coefficient {} in chunk {c}",
                                at(r, p),
                                idx[j]
                            );
                        }
                    }
                    if r == 0 {
                        let n = idx.len();
                        original_payload += n * (8 + 4);
                        our_payload +=
                            n * (IndexWidth::for_chunk_len(grid.chunk_len()).bytes() + 4);
                    }
                }
            }
            // Bytes: the original counts int64 indices and f32 values, receiving K copies
            // (its own included); we send narrow indices over a ring all-gather.
            for (r, obs) in observed.iter().enumerate() {
                let transmit = step["data_transmit"][r].as_u64().unwrap() as usize;
                let receive = step["data_receive"][r].as_u64().unwrap() as usize;
                assert_eq!(
                    transmit,
                    original_payload,
                    "{name} step {}: original bytes",
                    i + 1
                );
                assert_eq!(receive, k * transmit);
                assert_eq!(obs[i].payload, our_payload, "{name}: our payload");
                let ring = ((k - 1) * our_payload) as u64;
                assert_eq!((obs[i].bytes_sent, obs[i].bytes_received), (ring, ring));
            }
            assert!(topk > 0);
        }
    }
}

#[test]
fn chunk_sizes_and_dct_matrices_match_the_original() {
    let v = load_vectors();
    for key in ["get_smaller_split", "get_smaller_split_extra"] {
        for e in v[key].as_array().unwrap() {
            let (n, target) = (e["n"].as_u64().unwrap(), e["target"].as_u64().unwrap());
            assert_eq!(
                chunk_size(n as usize, target as usize) as u64,
                e["result"].as_u64().unwrap(),
                "chunk_size({n}, {target})"
            );
        }
    }
    let mut dct = Dct::new();
    for m in v["dct_matrices"].as_array().unwrap() {
        let n = m["n"].as_u64().unwrap() as usize;
        let (forward, inverse) = (floats(&m["forward"]), floats(&m["inverse"]));
        // Column i of C is the DCT-II of e_i: forward[i][k] = C[k][i] = inverse[k][i].
        for i in 0..n {
            let mut e = vec![0.0; n];
            e[i] = 1.0;
            dct.forward(n, &mut e);
            for (k, &c) in e.iter().enumerate() {
                assert!((c - forward[i * n + k]).abs() <= 1e-6, "n {n}: F[{i}][{k}]");
                assert!((c - inverse[k * n + i]).abs() <= 1e-6, "n {n}: B[{k}][{i}]");
            }
        }
    }
}

/// With every coefficient sent (topk ≥ chunk size) and one node, DeMo's step is sign-SGD on
/// `lr·grad`: `θ ← θ − lr·sign(g)`, bit for bit, and nothing is left in the buffer. The
/// shapes include a conv kernel, which the original cannot transform.
#[test]
fn full_topk_on_one_node_is_sign_sgd() {
    let shapes = vec![vec![7], vec![12, 10], vec![8, 3, 3, 3], vec![5, 2, 6]];
    let device = Device::default().autodiff();
    let mut seed = 12345u64;
    let mut next = || {
        // xorshift: uniform in [0.1, 1) with a random sign, away from 0 so signs are robust.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let u = (seed >> 40) as f32 / (1u64 << 24) as f32;
        let s = if seed & 1 == 0 { 1.0 } else { -1.0 };
        s * (0.1 + 0.9 * u)
    };
    let values: Vec<Vec<f32>> = shapes
        .iter()
        .map(|s| (0..s.iter().product()).map(|_| next()).collect())
        .collect();
    let (model, _) = Tensors::new(&shapes, &values, &device);
    let layout = ParamLayout::trainable(&model);
    let n = layout.num_elements();
    let before = host(layout.flatten(&model));
    let grads: Vec<f32> = (0..n).map(|_| next()).collect();
    let lr = 0.01;
    let config = DeMoConfig::new()
        .with_lr(lr)
        .with_compression_topk(1 << 20)
        .with_compression_chunk(4);
    let group = InProcessGroup::new(1);
    let comm = group.handle(0);
    let info = node_info(0, 1, 1, &device, &layout, &model);
    let mut demo = DeMo::new(&config, &info).unwrap();
    let mut replica = ModelReplica::new(model, layout.clone());
    let mut ctx = StepContext {
        rank: 0,
        world_size: 1,
        step: 0,
        max_steps: 1,
        replica: &mut replica,
        collective: &comm,
        layout: &layout,
    };
    let g = Tensor::from_data(TensorData::new(grads.clone(), [n]), &device.clone().inner());
    demo.step(g, &mut ctx).unwrap();
    let after = host(replica.params());
    let lr32 = lr as f32;
    for i in 0..n {
        let expected = before[i] - lr32 * grads[i].signum();
        assert_eq!(after[i], expected, "element {i}");
    }
    for p in 0..shapes.len() {
        let residual = demo.delta(p).iter().map(|x| x.abs()).fold(0.0, f32::max);
        assert!(residual <= 1e-6 * lr32, "param {p}: residual {residual}");
    }
}

#[test]
fn invalid_settings_are_typed_errors() {
    let device = Device::default().autodiff();
    let (model, _) = Tensors::new(&[vec![4]], &[vec![0.0; 4]], &device);
    let layout = ParamLayout::trainable(&model);
    let info = node_info(0, 1, 1, &device, &layout, &model);
    for (config, what) in [
        (
            DeMoConfig::new().with_compression_topk(0),
            "compression_topk",
        ),
        (
            DeMoConfig::new().with_compression_chunk(0),
            "compression_chunk",
        ),
        (
            DeMoConfig::new().with_compression_decay(1.0),
            "compression_decay",
        ),
        (DeMoConfig::new().with_lr(-1.0), "`lr`"),
        (DeMoConfig::new().with_lr(f64::NAN), "`lr`"),
        (
            DeMoConfig::new().with_weight_decay(f64::NAN),
            "weight_decay",
        ),
    ] {
        match config.init(&info) {
            Err(e) => assert!(e.to_string().contains(what), "{e}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }
}

/// A small conv net for `[batch, 1, 1, 16]` inputs: its kernel is a 4-D parameter.
#[derive(Module, Debug)]
struct TinyConvNet {
    conv: burn::nn::conv::Conv2d,
    head: burn::nn::Linear,
}

impl TinyConvNet {
    fn new(device: &Device) -> Self {
        TinyConvNet {
            conv: burn::nn::conv::Conv2dConfig::new([1, 8], [1, 3])
                .with_padding(burn::nn::PaddingConfig2d::Same)
                .init(device),
            head: burn::nn::LinearConfig::new(8 * 16, 4).init(device),
        }
    }

    fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        let x = burn::tensor::activation::relu(self.conv.forward(images));
        self.head.forward(x.flatten::<2>(1, 3))
    }
}

impl gym_core::TrainModel for TinyConvNet {
    type Batch = gym_core::ImageBatch;

    fn loss(&self, batch: &Self::Batch) -> Tensor<1> {
        gym_models::cross_entropy(self.forward(batch.images.clone()), batch.targets.clone())
    }

    fn evaluate(&self, batch: &Self::Batch) -> gym_core::EvalMetrics {
        gym_models::classification_metrics(
            self.forward(batch.images.clone()),
            batch.targets.clone(),
        )
    }
}

/// DeMo trains a model with a conv kernel on 4 nodes, sending a fraction of AllReduce's
/// bytes, and the replicas stay identical (every node applies the same sign step).
#[test]
fn demo_trains_a_conv_net_on_four_nodes() {
    use gym_core::{NodeData, Trainer, TrainerConfig};
    use tests::{Synthetic, SyntheticBatcher};
    let data = NodeData::shared(
        Synthetic::new(2048, 16, 4, 1),
        Synthetic::new(256, 16, 4, 2),
    );
    let config = TrainerConfig::new(4)
        .with_max_steps(Some(80))
        .with_batch_size(16)
        .with_val_size(Some(256))
        .with_val_interval(1000)
        .with_seed(3);
    let strategy = DeMoConfig::new()
        .with_lr(3e-3)
        .with_compression_topk(4)
        .with_compression_chunk(16);
    let out = Trainer::new(config)
        .fit(TinyConvNet::new, &strategy, &data, &SyntheticBatcher)
        .expect("DeMo runs");
    let first = &out.report.validation[0];
    let last = out.report.final_validation().unwrap();
    assert!(
        last.global_loss < 0.7 * first.global_loss,
        "loss {} → {}",
        first.global_loss,
        last.global_loss
    );
    assert!(last.global_accuracy.unwrap() > 0.6, "{last:?}");
    // Identical replicas: the average evaluates like rank 0's own model (up to the
    // rounding of the average).
    assert!((last.local_loss - last.global_loss).abs() <= 1e-5 * last.local_loss);
    // Traffic per step: k = 4 coefficients per chunk, each a u8 index and an f32 value:
    // conv kernel [8,1,1,3] as 8×3 (one chunk) 20 B, conv bias [8] 20 B, head [128,4] in
    // chunks of 16×4 (8 chunks) 160 B, head bias [4] 20 B: 220 B, ring all-gather ×3.
    let per_step = out.report.bytes_sent_per_node() / 80.0;
    assert_eq!(per_step, 660.0);
    let device = Device::default().autodiff();
    let n = ParamLayout::trainable(&TinyConvNet::new(&device)).num_elements();
    let all_reduce = (2 * 3 * 4 * n / 4) as f64; // ring all-reduce of the f32 gradient
    assert!(
        per_step < 0.25 * all_reduce,
        "{per_step} bytes per step vs {all_reduce}"
    );
}
