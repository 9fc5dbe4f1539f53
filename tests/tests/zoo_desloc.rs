//! DES-LOC (arXiv 2505.22549) against Local Adam written here, Burn's AdamW, FedAvg and its
//! byte formula. `cargo test --release -- zoo`.

use burn::tensor::{Device, Tensor, TensorData};
use gym_core::rng::lock_backend_rng;
use gym_core::{
    GymError, InnerOptimizerConfig, LrScheduleConfig, NodeInfo, ParamLayout, ReduceOp, Result,
    StepContext, Strategy, StrategyConfig,
};
use gym_strategies::{AllReduceConfig, AveragingCommunicatorConfig, DesLocConfig, FedAvgConfig};
use tests::{fit_small_mlp, flat_params, init_rank0, max_abs_diff, small_mlp};

fn params(strategy: &dyn StrategyConfig, k: usize, steps: usize) -> (Vec<f32>, u64, u64) {
    let out = fit_small_mlp(k, steps, 8, 5, strategy);
    let comm = out.report.comm[0];
    (
        flat_params(&out.model),
        comm.bytes_sent,
        comm.all_reduce_calls,
    )
}

/// The layout of the small MLP. Building a model draws from the backend's process-wide
/// generator: under its lock, or a `fit` running in parallel (another test) would see its
/// own draws disturbed.
fn layout() -> ParamLayout {
    let _guard = lock_backend_rng();
    ParamLayout::trainable(&small_mlp(&Device::default().autodiff()))
}

fn num_params() -> u64 {
    layout().num_elements() as u64
}

fn host(t: Tensor<1>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().expect("f32 values")
}

/// Local Adam with full-state averaging, written from its definition on host vectors:
/// AdamW (PyTorch's form) on every node, and after every `h`-th step the mean of θ, u and v.
struct LocalAdam {
    lr: f32,
    h: usize,
}

struct LocalAdamNode {
    lr: f32,
    h: usize,
    u: Vec<f32>,
    v: Vec<f32>,
}

impl StrategyConfig for LocalAdam {
    fn name(&self) -> String {
        "local-adam".into()
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn Strategy>> {
        let n = node.layout.num_elements();
        Ok(Box::new(LocalAdamNode {
            lr: self.lr,
            h: self.h,
            u: vec![0.0; n],
            v: vec![0.0; n],
        }))
    }
}

impl Strategy for LocalAdamNode {
    fn step(&mut self, grads: Tensor<1>, ctx: &mut StepContext<'_>) -> Result<()> {
        let (b1, b2, eps, wd) = (0.9f32, 0.999f32, 1e-8f32, 0.01f32);
        let device = grads.device();
        let g = host(grads);
        let mut theta = host(ctx.replica.params());
        let t = (ctx.step + 1) as i32;
        for i in 0..g.len() {
            self.u[i] = b1 * self.u[i] + (1.0 - b1) * g[i];
            self.v[i] = b2 * self.v[i] + (1.0 - b2) * g[i] * g[i];
            let u_hat = self.u[i] / (1.0 - b1.powi(t));
            let v_hat = self.v[i] / (1.0 - b2.powi(t));
            theta[i] = theta[i] * (1.0 - self.lr * wd) - self.lr * u_hat / (v_hat.sqrt() + eps);
        }
        if ctx.ends_round(self.h) {
            let mean = |x: &mut Vec<f32>| -> Result<()> {
                let t = Tensor::<1>::from_data(TensorData::new(x.clone(), [x.len()]), &device);
                *x = host(ctx.collective.all_reduce(t, ReduceOp::Mean)?);
                Ok(())
            };
            mean(&mut self.u)?;
            mean(&mut self.v)?;
            mean(&mut theta)?;
        }
        let n = theta.len();
        ctx.replica
            .set_params(Tensor::from_data(TensorData::new(theta, [n]), &device));
        Ok(())
    }

    fn lr(&self) -> f64 {
        self.lr as f64
    }
}

#[test]
fn zoo_desloc_with_equal_periods_is_local_adam_with_full_state_averaging() {
    let (k, steps, h, lr) = (4, 23, 5, 3e-3);
    let desloc = DesLocConfig::new()
        .with_lr(lr)
        .with_param_interval(h)
        .with_first_moment_interval(Some(h))
        .with_second_moment_interval(Some(h));
    let (a, bytes_a, calls_a) = params(&desloc, k, steps);
    let (b, bytes_b, calls_b) = params(&LocalAdam { lr: lr as f32, h }, k, steps);
    let d = max_abs_diff(&a, &b);
    assert!(d <= 1e-5, "max |Δ| = {d:e}");
    // θ, u and v averaged after steps 4, 9, 14 and 19.
    assert_eq!((calls_a, bytes_a), (calls_b, bytes_b));
    assert_eq!(calls_a, 3 * 4);
}

#[test]
fn zoo_desloc_on_one_node_is_burns_adamw() {
    // PyTorch AdamW defaults on both sides (betas 0.9/0.999, ε 1e-8, decay 0.01), the same
    // warmup-cosine schedule and global-norm clipping: the flat Adam against Burn's.
    let schedule = LrScheduleConfig::new()
        .with_warmup_steps(5)
        .with_cosine(true);
    let desloc = DesLocConfig::new()
        .with_lr(3e-3)
        .with_schedule(schedule.clone())
        .with_max_norm(Some(1.0))
        .with_param_interval(2);
    let adamw = AllReduceConfig::new().with_inner(
        InnerOptimizerConfig::new()
            .with_lr(3e-3)
            .with_schedule(schedule)
            .with_max_norm(Some(1.0)),
    );
    let (a, _, _) = params(&desloc, 1, 30);
    let (b, _, _) = params(&adamw, 1, 30);
    let d = max_abs_diff(&a, &b);
    assert!(d <= 1e-5, "max |Δ| = {d:e}");
}

#[test]
fn zoo_desloc_without_moment_averaging_is_fedavg_over_local_adamw() {
    // K_u = K_v = ∞: only θ is averaged, the moments stay local (Local SGD with persistent
    // local Adam states, the paper's FAVG+OPT), which FedAvg over AdamW also is.
    let (k, steps, h) = (4usize, 22usize, 4usize);
    let never = Some(1_000_000);
    let desloc = DesLocConfig::new()
        .with_lr(3e-3)
        .with_param_interval(h)
        .with_first_moment_interval(never)
        .with_second_moment_interval(never);
    let fedavg = FedAvgConfig::new()
        .with_inner(InnerOptimizerConfig::new().with_lr(3e-3))
        .with_communicator(AveragingCommunicatorConfig::new().with_sync_interval(h));
    let (a, bytes, calls) = params(&desloc, k, steps);
    let (b, _, _) = params(&fedavg, k, steps);
    let d = max_abs_diff(&a, &b);
    assert!(d <= 1e-5, "max |Δ| = {d:e}");
    // ⌊22/4⌋ = 5 parameter averagings, each a ring all-reduce of N f32:
    // ⌊2(K−1)·4N/K⌋ bytes sent per node.
    let n = num_params();
    let k = k as u64;
    assert_eq!(calls, 5);
    assert_eq!(bytes, 5 * (2 * (k - 1) * 4 * n / k));
}

#[test]
fn zoo_desloc_bytes_with_the_default_periods_follow_the_formula() {
    // K_x = 16, K_u = 48, K_v = 96 over 100 steps on 3 nodes.
    let (k, steps) = (3u64, 100u64);
    let desloc = DesLocConfig::new();
    assert_eq!(
        (
            desloc.param_interval,
            desloc.first_moment_period(),
            desloc.second_moment_period()
        ),
        (16, 48, 96)
    );
    let (_, bytes, calls) = params(&desloc, k as usize, steps as usize);
    let syncs = steps / 16 + steps / 48 + steps / 96;
    assert_eq!(syncs, 6 + 2 + 1);
    assert_eq!(calls, syncs);
    // ⌊2·2·4·676/3⌋ = 3605 per averaging: the fraction is dropped per call.
    let per_sync = 2 * (k - 1) * 4 * num_params() / k;
    assert_eq!(bytes, syncs * per_sync);
}

fn refusal(config: &DesLocConfig) -> String {
    match init_rank0(config, &layout(), 2, 10) {
        Err(GymError::InvalidConfig(why)) => why,
        Err(e) => panic!("expected InvalidConfig, got {e}"),
        Ok(_) => panic!("accepted {config:?}"),
    }
}

#[test]
fn zoo_desloc_refuses_zero_periods_and_bad_adam_settings_naming_them() {
    let base = DesLocConfig::new();
    for (config, field) in [
        (base.clone().with_param_interval(0), "param_interval"),
        (
            base.clone().with_first_moment_interval(Some(0)),
            "first_moment_interval",
        ),
        (
            base.clone().with_second_moment_interval(Some(0)),
            "second_moment_interval",
        ),
        (base.clone().with_betas((1.0, 0.999)), "betas"),
        (base.clone().with_betas((0.9, -0.1)), "betas"),
        (base.clone().with_lr(0.0), "lr"),
        (base.clone().with_rho(Some(0.0)), "rho"),
        (base.clone().with_max_norm(Some(-1.0)), "max_norm"),
    ] {
        let why = refusal(&config);
        assert!(why.contains(&format!("`{field}`")), "{field}: {why}");
    }
    assert_eq!(base.name(), "desloc");
}
