//! A run of many node threads starts the binary again without glibc's per-thread caches
//! (`gym_core::allocator::fit_to_threads`): the restarted process parses the same command
//! line, so it trains the same run; a run of few threads, or one whose environment sets the
//! allocator, is not restarted.

use std::path::{Path, PathBuf};
use std::process::Output;

const NOTICE: &str = "allocator: glibc's per-thread caches off for";

fn temp_dir(name: &str) -> PathBuf {
    tests::scratch_dir("alloc", name)
}

/// Two MNIST nodes for 3 steps, each node's kernels on a pool of `kernel_threads`.
fn mnist(logs: &Path, kernel_threads: usize, tunables: Option<&str>) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_mnist"));
    command
        .args(["--no-progress", "--run-name", "run", "--val-size", "0"])
        .args(["--strategy", "diloco", "--sync-interval", "2"])
        .args(["--num-nodes", "2", "--max-steps", "3", "--batch-size", "8"])
        .args(["--kernel-threads-per-node", &kernel_threads.to_string()])
        .arg("--log-dir")
        .arg(logs)
        .arg("--data-dir")
        .arg(tests::shared_data("mnist"))
        .env_remove("GLIBC_TUNABLES")
        .env_remove(gym_core::allocator::RESTARTED_VARIABLE);
    if let Some(t) = tunables {
        command.env("GLIBC_TUNABLES", t);
    }
    let out = command.output().expect("mnist runs");
    tests::assert_succeeded(&out);
    out
}

fn final_loss(logs: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(logs.join("run/summary.json")).unwrap();
    let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
    summary["final_train_loss"].clone()
}

#[test]
fn many_node_threads_restart_the_binary_without_thread_caches_and_train_the_same_run() {
    // 2 nodes × (1 + 200 kernel threads) = 402 threads, over MANY_THREADS.
    const { assert!(2 * 201 >= gym_core::allocator::MANY_THREADS) };
    let (restarted, set_by_user, few) = (temp_dir("many"), temp_dir("user"), temp_dir("few"));

    let out = mnist(&restarted, 200, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let notice = stderr.lines().find(|l| l.starts_with(NOTICE));
    assert!(
        notice.is_some_and(|l| l.contains("402 node threads")
            && l.contains(&gym_core::allocator::many_threads_tunables())),
        "{stderr}"
    );

    // The same run with the allocator set by the environment: not restarted.
    let out = mnist(&set_by_user, 200, Some("glibc.malloc.tcache_count=7"));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(NOTICE));
    // And a run of few threads: not restarted either.
    let out = mnist(&few, 1, None);
    assert!(!String::from_utf8_lossy(&out.stderr).contains(NOTICE));

    // The restarted process read the same command line: the same training, to the bit.
    let loss = final_loss(&restarted);
    assert!(loss.as_f64().is_some_and(f64::is_finite), "{loss}");
    assert_eq!(loss, final_loss(&set_by_user));
    assert_eq!(loss, final_loss(&few));
    for dir in [restarted, set_by_user, few] {
        std::fs::remove_dir_all(dir).ok();
    }
}
