#!/usr/bin/env python3
"""Run the original Python EXO Gym (github.com/exo-explore/gym) on this project's benchmark
set-ups and write its figures as one JSON line, in the format of docs/original-results.jsonl
(read by `bench --peer-results FILE`).

One invocation is one run (one task, one strategy), in a process of its own, as `bench` runs
each of its rows. `examples/scripts/run-original.sh` calls it once per strategy.

The original is used as a library, unmodified, from its source tree (--gym-dir): its
`Trainer.fit` spawns one process per node; its strategies, `TrainNode` loop, evaluation and
logging run as they are. The harness only

* builds the data sets from the local files (no download): MNIST from the four IDX .gz
  files, normalised as the original's example does (mean 0.1307, std 0.3081) but without
  its RandomAffine augmentation and torchvision's PIL round trip (this project trains
  without augmentation); tiny-shakespeare from input.txt (the first 90% to train on, the
  rest to validate), tokenised with the original's character vocabulary;
* builds the models: the 784-256-10 MLP of this project (the original has no MLP; it is
  wrapped in the original's `ModelWrapper`), the original's MNIST `CNN` and `ModelWrapper`
  (their class definitions read from example/mnist.py, whose torchvision and matplotlib
  imports are not needed), and the original's nanoGPT (example/nanogpt/nanogpt.py);
* times the run from hooks on rank 0's `TrainNode._evaluate`, which the original calls
  before step 0 and once after the last step: loop it/s = steps / (time between the two);
* runs each node process with --threads torch threads (default 1, through
  OMP_NUM_THREADS; the original leaves torch's default, one per core in each of the K
  processes, which oversubscribes the cores);
* passes minibatch_size = batch_size, so the original skips its minibatch-size probe (a
  spawned trial run before training; --auto-minibatch keeps it);
* samples the RSS of the whole process tree (the parent, the node processes, the
  multiprocessing manager), summed, as the original's own `_PeakMemSampler` does;
* evaluates the model `Trainer.fit` returns (the average of the nodes' final replicas) on
  the whole validation set: MNIST's 10,000 test images (loss, accuracy), or the held-out last
  10% of the text cut into non-overlapping windows (loss), as this project's final
  evaluation does.

Workaround: the original pins gloo to the interface `lo0` (`GLOO_SOCKET_IFNAME=lo0`, macOS's
loopback name). Where no interface has that name (Linux: `lo`), the harness wraps
`torch.distributed.init_process_group` in the node processes so that it uses the loopback
interface instead; nothing else of the original is changed.
"""

import argparse
import ast
import gzip
import json
import os
import platform
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

# Environment variables through which the parent hands the set-up to the node processes
# (spawned children inherit the environment and re-import this file as __mp_main__).
ENV_GYM_DIR = "EXOGYM_HARNESS_GYM_DIR"
ENV_TIMING_DIR = "EXOGYM_HARNESS_TIMING_DIR"

# ── the original, imported from its source tree ───────────────────────────────────────

_installed = False


def _defs_from_source(path, names, namespace):
    """Executes the top-level class/function definitions `names` of the Python file `path`
    in `namespace` (the file's other statements, its imports included, are not run)."""
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    found = [n for n in tree.body
             if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in names]
    missing = set(names) - {n.name for n in found}
    if missing:
        raise RuntimeError(f"{path}: no top-level definition of {sorted(missing)}")
    exec(compile(ast.Module(body=found, type_ignores=[]), path, "exec"), namespace)


def _loopback_fix():
    """Wraps torch.distributed.init_process_group so that a GLOO_SOCKET_IFNAME naming an
    interface this machine does not have (the original's `lo0`) is replaced by the
    loopback interface."""
    import torch.distributed as dist

    if getattr(dist.init_process_group, "_harness_wrapped", False):
        return
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return
    loopback = "lo" if "lo" in names else ("lo0" if "lo0" in names else None)
    real = dist.init_process_group

    def init_process_group(*args, **kwargs):
        ifname = os.environ.get("GLOO_SOCKET_IFNAME")
        if ifname and ifname not in names and loopback:
            os.environ["GLOO_SOCKET_IFNAME"] = loopback
        return real(*args, **kwargs)

    init_process_group._harness_wrapped = True
    dist.init_process_group = init_process_group


def _timing_hooks():
    """Times rank 0's training loop from the original's own evaluation calls: `train()`
    calls `_evaluate` before step 0 (step 0 is a multiple of every val_interval) and once
    after the last step. Each rank writes its figures to ENV_TIMING_DIR."""
    import resource
    from exogym.train_node import TrainNode

    if getattr(TrainNode._evaluate, "_harness_wrapped", False):
        return
    from exogym.aux import logger as original_logger

    real_init = TrainNode.__init__
    real_evaluate = TrainNode._evaluate
    last_loss = {}

    # Rank 0's logger receives every step's training loss; the last is the run's final
    # training loss (its CSV logger overrides the base class's method: both are wrapped).
    for cls in (original_logger.Logger, original_logger.CSVLogger):
        def log_train(self, loss, _real=cls.log_train):
            last_loss["loss"] = float(loss)
            return _real(self, loss)

        cls.log_train = log_train

    def __init__(self, config):
        self._harness = {"node_init": time.time()}
        real_init(self, config)
        self._harness["node_ready"] = time.time()

    def _evaluate(self):
        h = getattr(self, "_harness", None)
        if h is not None:
            if self.local_step == 0 and "loop_start" not in h:
                h["loop_start"] = time.time()
            elif self.max_steps is not None and self.local_step >= self.max_steps:
                h["loop_end"] = time.time()
                h["steps"] = self.local_step
                h["rank"] = self.rank
                h["final_train_loss"] = last_loss.get("loss")
                # ru_maxrss: KiB on Linux, bytes on macOS.
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                h["peak_rss_bytes"] = rss if sys.platform == "darwin" else rss * 1024
                out = os.environ.get(ENV_TIMING_DIR)
                if out:
                    with open(os.path.join(out, f"rank{self.rank}.json"), "w") as f:
                        json.dump(h, f)
        return real_evaluate(self)

    __init__._harness_wrapped = True
    _evaluate._harness_wrapped = True
    TrainNode.__init__ = __init__
    TrainNode._evaluate = _evaluate


def install(gym_dir):
    """Makes the original importable from `gym_dir` and loads the model definitions this
    harness takes from its examples. Runs in the parent and, on import, in every node
    process (classes of pickled models must resolve there too)."""
    global _installed
    if _installed:
        return
    gym_dir = os.path.abspath(gym_dir)
    for p in (os.path.join(gym_dir, "example", "nanogpt"), gym_dir):
        if p not in sys.path:
            sys.path.insert(0, p)
    # The example definitions run in this module's namespace (torch, nn, F imported above),
    # so that node processes find them where the pickled models name them.
    g = globals()
    _defs_from_source(os.path.join(gym_dir, "example", "mnist.py"),
                      ["CNN", "ModelWrapper"], g)
    _defs_from_source(os.path.join(gym_dir, "example", "nanogpt", "build_dataset.py"),
                      ["generate_char_vocab"], g)
    import exogym  # noqa: F401
    _loopback_fix()
    _timing_hooks()
    _installed = True


if __name__ == "__mp_main__" and os.environ.get(ENV_GYM_DIR):
    # A node process (spawned by the original's Trainer): set up the same definitions.
    install(os.environ[ENV_GYM_DIR])

# ── models and data (top level, so that node processes can unpickle them) ─────────────


class MLP(nn.Module):
    """This project's MNIST MLP: 784-256-10 with ReLU (203,530 parameters); the original
    has no MLP."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def _read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 0x00000803:
        rows, cols = struct.unpack(">II", data[8:16])
        return data[16:], (n, rows, cols)
    if magic == 0x00000801:
        return data[8:], (n,)
    raise ValueError(f"{path}: not an IDX image or label file (magic {magic:#010x})")


class MnistDataset(torch.utils.data.Dataset):
    """MNIST from the IDX files, items shaped as the original's example serves them:
    (1×28×28 float tensor normalised with mean 0.1307, std 0.3081, label), without its
    augmentation. Pixels are held as one uint8 tensor, which torch.multiprocessing shares
    with the node processes instead of copying it."""

    def __init__(self, data_dir, split):
        import numpy as np

        prefix = "train" if split == "train" else "t10k"
        images, ishape = _read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
        labels, lshape = _read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
        assert ishape[0] == lshape[0], "image and label counts differ"
        self.images = torch.from_numpy(np.frombuffer(images, np.uint8).reshape(ishape).copy())
        self.labels = torch.from_numpy(np.frombuffer(labels, np.uint8).astype(np.int64))

    def __len__(self):
        return self.labels.shape[0]

    def __getitem__(self, i):
        x = (self.images[i].float().div_(255.0).sub_(0.1307).div_(0.3081)).unsqueeze(0)
        return x, int(self.labels[i])


# ── measurement ────────────────────────────────────────────────────────────────────


class TreeMemorySampler:
    """Peak of the summed RSS (and, less often, PSS) of this process and all its
    descendants, sampled in a background thread."""

    def __init__(self, period_s=0.1, pss_every=20):
        import psutil

        self.psutil = psutil
        self.proc = psutil.Process(os.getpid())
        self.period_s = period_s
        self.pss_every = pss_every
        self.peak_rss = 0
        self.peak_pss = 0
        self.max_procs = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, pss):
        procs = [self.proc]
        try:
            procs += self.proc.children(recursive=True)
        except self.psutil.Error:
            pass
        rss = pss_total = 0
        for p in procs:
            try:
                if pss:
                    m = p.memory_full_info()
                    rss += m.rss
                    pss_total += getattr(m, "pss", m.rss)
                else:
                    rss += p.memory_info().rss
            except self.psutil.Error:
                pass
        self.peak_rss = max(self.peak_rss, rss)
        self.max_procs = max(self.max_procs, len(procs))
        if pss:
            self.peak_pss = max(self.peak_pss, pss_total)

    def _run(self):
        i = 0
        while not self._stop.is_set():
            self._sample(pss=self.pss_every > 0 and i % self.pss_every == 0)
            i += 1
            self._stop.wait(self.period_s)

    def start(self):
        self._sample(pss=self.pss_every > 0)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()
        self._sample(pss=self.pss_every > 0)


def _process_start_time():
    """When this process started (epoch seconds): from /proc (to a clock tick) where there
    is one, else the time this file was imported."""
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(after_name[19])  # field 22, starttime, in clock ticks after boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORT_TIME


_IMPORT_TIME = time.time()


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _git_commit(gym_dir):
    """The source tree's commit: its COMMIT file (a copy without git's folder, as
    examples/gpu-check.sh carries it, inside another repository), else git's."""
    try:
        with open(os.path.join(gym_dir, "COMMIT")) as f:
            return f.read().strip()[:7] or None
    except OSError:
        pass
    try:
        return subprocess.run(["git", "-C", gym_dir, "rev-parse", "--short=7", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return None


# ── the set-ups ─────────────────────────────────────────────────────────────────────

STRATEGIES = ["allreduce", "diloco", "sparta", "fedavg", "sparta-diloco", "demo"]


def build_strategy(name, a):
    """The original's strategy for this project's strategy `name`, with the set-up's
    hyper-parameters. Scheduler: the original's `lambda_cosine` (linear warmup, then
    constant unless --cosine) when --warmup-steps > 0 or --cosine, else none."""
    from exogym.strategy.optim import OptimSpec

    common = {}
    if a.warmup_steps > 0 or a.cosine:
        common["lr_scheduler"] = "lambda_cosine"
        common["lr_scheduler_kwargs"] = {"warmup_steps": a.warmup_steps,
                                         "cosine_anneal": a.cosine}
    if a.max_norm:
        common["max_norm"] = a.max_norm
    adamw = OptimSpec(torch.optim.AdamW, lr=a.lr)
    if name == "allreduce":
        from exogym.strategy.strategy import SimpleReduceStrategy
        return SimpleReduceStrategy(optim_spec=adamw, **common)
    if name == "diloco":
        from exogym.strategy.diloco import DiLoCoStrategy
        return DiLoCoStrategy(optim_spec=adamw, H=a.H, **common)
    if name == "sparta":
        from exogym.strategy.sparta import SPARTAStrategy
        return SPARTAStrategy(optim_spec=adamw, p_sparta=a.p_sparta, **common)
    if name == "fedavg":
        from exogym.strategy.federated_averaging import FedAvgStrategy
        # FedAvg's own `inner_optim` argument is ignored by the original (it would train
        # with AdamW at lr 1e-3); `optim_spec`, passed through its **kwargs, is what works.
        return FedAvgStrategy(optim_spec=adamw, H=a.H, **common)
    if name == "sparta-diloco":
        from exogym.strategy.sparta_diloco import SPARTADiLoCoStrategy
        return SPARTADiLoCoStrategy(inner_optim_spec=adamw, H=a.H, p_sparta=a.p_sparta,
                                    **common)
    if name == "demo":
        from exogym.strategy.demo import DeMoStrategy
        # DeMo takes no optimizer spec; its lr reaches the optimizer through the
        # `strategy_config.optimizer_kwargs` hook of DeMoStrategy._init_node. The original
        # ignores max_norm for DeMo.
        common.pop("max_norm", None)
        lr = a.demo_lr if a.demo_lr is not None else a.lr
        return DeMoStrategy(
            strategy_config=types.SimpleNamespace(optimizer_kwargs={"lr": lr}), **common)
    raise SystemExit(f"unknown strategy {name!r} (one of {', '.join(STRATEGIES)})")


TASK_DEFAULTS = {
    # bench --task mnist: MLP, 4 nodes, 200 steps, batch 64, lr 3e-4 (DeMo 1e-3), H 20,
    # p 0.005; evaluations of 512 examples every 50 steps.
    "mnist": dict(steps=200, batch_size=64, lr=3e-4, demo_lr=1e-3, warmup_steps=0,
                  max_norm=None, val_size=512, val_interval=50),
    # bench's CNN rows: the original's CNN, 64 images per node, a few steps, no
    # intermediate evaluation.
    "cnn": dict(steps=10, batch_size=64, lr=3e-4, demo_lr=1e-3, warmup_steps=0,
                max_norm=None, val_size=0, val_interval=50),
    # bench --task nanogpt: 2 layers × 2 heads × 64 dims, context 64, 16 sequences per
    # node, 100 steps, lr 1e-3, warmup 10, clip 1.0, H 20; evaluations of 256 sequences
    # every 100 steps.
    "nanogpt": dict(steps=100, batch_size=16, lr=1e-3, demo_lr=None, warmup_steps=10,
                    max_norm=1.0, val_size=256, val_interval=100),
}


def build_task(a):
    """(model, train set, validation set, final evaluation) for the task."""
    import numpy as np

    if a.task in ("mnist", "cnn"):
        d = a.data_dir
        if os.path.isdir(os.path.join(d, "mnist")):
            d = os.path.join(d, "mnist")
        train, val = MnistDataset(d, "train"), MnistDataset(d, "test")
        backbone = MLP() if a.task == "mnist" else CNN()  # noqa: F821
        model = ModelWrapper(backbone)  # noqa: F821  (the original's)

        def final_eval(m):
            m.eval()
            n = len(val) if a.eval_size <= 0 else min(a.eval_size, len(val))
            loss = correct = 0.0
            with torch.no_grad():
                for s in range(0, n, 500):
                    e = min(n, s + 500)
                    x = (val.images[s:e].float() / 255.0 - 0.1307) / 0.3081
                    y = val.labels[s:e]
                    logits = m.backbone(x.unsqueeze(1))
                    loss += torch.nn.functional.cross_entropy(
                        logits, y, reduction="sum").item()
                    correct += (logits.argmax(1) == y).sum().item()
            return {"val_accuracy": correct / n, "val_loss": loss / n, "val_examples": n}

        return model, train, val, final_eval

    if a.task == "nanogpt":
        import nanogpt as nanogpt_model  # the original's example/nanogpt/nanogpt.py
        from gpt_dataset import ContiguousGPTTrainDataset  # ... and gpt_dataset.py

        d = a.data_dir
        if os.path.isdir(os.path.join(d, "shakespeare")):
            d = os.path.join(d, "shakespeare")
        with open(os.path.join(d, "input.txt"), encoding="utf-8") as f:
            text = f.read()
        char_int, _eos = generate_char_vocab()  # noqa: F821  (the original's)
        unknown = sorted(set(text) - set(char_int))
        if unknown:
            raise SystemExit(f"characters outside the original's vocabulary: {unknown!r}")
        tokens = np.fromiter((char_int[c] for c in text), dtype=np.int64, count=len(text))
        n_train = int(len(tokens) * 0.9)
        block = a.block_size
        train = ContiguousGPTTrainDataset(tokens[:n_train], block_size=block, device="cpu")
        val = ContiguousGPTTrainDataset(tokens[n_train:], block_size=block, device="cpu")
        config = nanogpt_model.GPTConfig(block_size=block, vocab_size=len(char_int),
                                         n_layer=a.n_layer, n_head=a.n_head,
                                         n_embd=a.n_embd, dropout=0.0, bias=True)
        model = nanogpt_model.GPT(config)

        def final_eval(m):
            m.eval()
            v = torch.from_numpy(tokens[n_train:])
            starts = list(range(0, len(v) - block, block))  # windows of block + 1 tokens
            if a.eval_size > 0:
                starts = starts[:a.eval_size]
            total = 0.0
            with torch.no_grad():
                for s in range(0, len(starts), 64):
                    w = torch.stack([v[i:i + block + 1] for i in starts[s:s + 64]])
                    total += m((w[:, :-1], w[:, 1:])).item() * w.shape[0]
            return {"val_loss": total / len(starts), "val_examples": len(starts)}

        return model, train, val, final_eval

    raise SystemExit(f"unknown task {a.task!r}")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gym-dir", default=os.environ.get("ORIGINAL_GYM_DIR", "../original-gym"),
                   help="the original's source tree (git clone https://github.com/exo-explore/gym); "
                        "default $ORIGINAL_GYM_DIR, else ../original-gym")
    p.add_argument("--data-dir", default=os.environ.get("GYM_DATA_DIR", "../shared/data"),
                   help="folder holding mnist/ and shakespeare/ (or the files themselves); default "
                        "$GYM_DATA_DIR, else ../shared/data")
    p.add_argument("--task", choices=["mnist", "cnn", "nanogpt"], default="mnist",
                   help="mnist: the MLP set-up (default); cnn: the original's MNIST CNN; nanogpt")
    p.add_argument("--strategy", default="allreduce", choices=STRATEGIES)
    p.add_argument("--steps", type=int, help="steps (default: mnist 200, cnn 10, nanogpt 100)")
    p.add_argument("--num-nodes", type=int, default=4, help="default 4")
    p.add_argument("--batch-size", type=int,
                   help="examples per node per step (default: mnist, cnn 64; nanogpt 16)")
    p.add_argument("--lr", type=float, help="default: mnist, cnn 3e-4; nanogpt 1e-3")
    p.add_argument("--demo-lr", type=float, help="DeMo's lr (default: mnist/cnn 1e-3, else --lr)")
    p.add_argument("-H", "--sync-interval", dest="H", type=int, default=20, help="default 20")
    p.add_argument("--p-sparta", type=float, default=0.005, help="default 0.005")
    p.add_argument("--warmup-steps", type=int, help="default: nanogpt 10, else 0")
    p.add_argument("--cosine", action="store_true", help="cosine decay after the warmup")
    p.add_argument("--max-norm", type=float, help="gradient clipping (default: nanogpt 1.0)")
    p.add_argument("--val-size", type=int, help="examples per intermediate evaluation "
                   "(0: none; default: mnist 512, cnn 0, nanogpt 256)")
    p.add_argument("--val-interval", type=int,
                   help="steps between evaluations (default: nanogpt 100, else 50)")
    p.add_argument("--eval-size", type=int, default=0,
                   help="examples (windows) of the final evaluation; 0: the whole validation set")
    p.add_argument("--block-size", type=int, default=64, help="nanogpt (default 64)")
    p.add_argument("--n-layer", type=int, default=2, help="nanogpt (default 2)")
    p.add_argument("--n-head", type=int, default=2, help="nanogpt (default 2)")
    p.add_argument("--n-embd", type=int, default=64, help="nanogpt (default 64)")
    p.add_argument("--seed", type=int, default=42, help="default 42")
    p.add_argument("--device", default="cpu",
                   help="the original's device: cpu (default), cuda (every node on the GPUs "
                        "round-robin, as the original places them), mps")
    p.add_argument("--threads", type=int,
                   help="torch threads per node process, through OMP_NUM_THREADS (default: "
                        "$OMP_NUM_THREADS if set, else 1, as this project's nodes use one "
                        "kernel thread each; 0: torch's default, one per core in each of the "
                        "K processes, the original's own behaviour, which oversubscribes the "
                        "cores K-fold)")
    p.add_argument("--auto-minibatch", action="store_true",
                   help="let the original probe for a minibatch size (a spawned probe run "
                        "before training) instead of minibatch = batch")
    p.add_argument("--logs", choices=["csv", "none"], default="csv",
                   help="csv (default): the original's CSVLogger (./logs/RUN/, tqdm bar on "
                        "rank 0); none: its no-op Logger")
    p.add_argument("--run-name", help="default: original-TASK-STRATEGY-TIME")
    p.add_argument("--out", help="append the JSON line to this file too")
    a = p.parse_args(argv)
    for k, v in TASK_DEFAULTS[a.task].items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    return a


def main(argv=None):
    t_process = _process_start_time()
    a = parse_args(argv)
    if not os.path.isfile(os.path.join(a.gym_dir, "exogym", "trainer.py")):
        raise SystemExit(f"{a.gym_dir}: not the original's source tree (no exogym/trainer.py); "
                         "git clone https://github.com/exo-explore/gym there, or give --gym-dir")
    gym_dir = os.path.abspath(a.gym_dir)
    os.environ[ENV_GYM_DIR] = gym_dir
    timing_dir = tempfile.mkdtemp(prefix="exogym-harness-")
    os.environ[ENV_TIMING_DIR] = timing_dir
    try:
        run(a, gym_dir, timing_dir, t_process)
    finally:
        shutil.rmtree(timing_dir, ignore_errors=True)


def run(a, gym_dir, timing_dir, t_process):
    """One run of the original; prints (and appends to --out) its JSON line."""
    loadavg = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if a.threads is None:
        a.threads = int(os.environ.get("OMP_NUM_THREADS") or 1)
    if a.threads > 0:
        # Read by torch when it starts in each spawned node process.
        os.environ["OMP_NUM_THREADS"] = str(a.threads)
        os.environ["MKL_NUM_THREADS"] = str(a.threads)
    else:
        os.environ.pop("OMP_NUM_THREADS", None)
        os.environ.pop("MKL_NUM_THREADS", None)

    sampler = TreeMemorySampler().start()
    install(gym_dir)
    from exogym.trainer import Trainer

    torch.manual_seed(a.seed)
    model, train, val, final_eval = build_task(a)
    strategy = build_strategy(a.strategy, a)
    run_name = a.run_name or "original-{}-{}-{}".format(
        a.task, a.strategy, time.strftime("%Y%m%d-%H%M%S"))
    # init_process_group_portsafe uses start_port + 199 (and the next ports on failure).
    port = max(1024, _free_port() - 199)
    trainer = Trainer(model, train, val, start_port=port, device=a.device)
    fit_kwargs = dict(
        num_epochs=1, strategy=strategy, num_nodes=a.num_nodes, max_steps=a.steps,
        batch_size=a.batch_size,
        minibatch_size=None if a.auto_minibatch else a.batch_size,
        shuffle=True, val_size=a.val_size, val_interval=a.val_interval,
        seed=a.seed, run_name=run_name)
    if a.logs == "none":
        fit_kwargs["disable_logging"] = True

    print(f"[harness] original {gym_dir} ({_git_commit(gym_dir)}), task {a.task}, "
          f"strategy {a.strategy}, {a.num_nodes} nodes, {a.steps} steps", file=sys.stderr)
    t_fit = time.time()
    final_model = trainer.fit(**fit_kwargs)
    t_fit_end = time.time()
    metrics = final_eval(final_model)
    t_end = time.time()
    sampler.stop()

    ranks = {}
    for r in range(a.num_nodes):
        path = os.path.join(timing_dir, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                ranks[r] = json.load(f)
    if 0 not in ranks or "loop_start" not in ranks[0]:
        raise SystemExit("rank 0 reported no timing (were the hooks installed in the node "
                         "processes?)")
    r0 = ranks[0]
    loop_s = r0["loop_end"] - r0["loop_start"]
    steps = r0["steps"]

    result = {"task": "nanogpt" if a.task == "nanogpt" else "mnist"}
    if a.task != "nanogpt":
        result["model"] = "mlp" if a.task == "mnist" else "cnn"
    result.update({
        "strategy": a.strategy,
        "params": sum(p.numel() for p in model.parameters()),
        "its_per_s": round(steps / loop_s, 3),
        "wall_s": round(t_end - t_process, 2),
        "startup_s": round(r0["loop_start"] - t_process, 2),
        "peak_rss_mib": round(sampler.peak_rss / 2**20),
    })
    if "val_accuracy" in metrics:
        result["val_accuracy"] = round(metrics["val_accuracy"], 4)
    result["val_loss"] = round(metrics["val_loss"], 4)
    # Further figures (bench reads the keys above and ignores these).
    result.update({
        "implementation": "exo-explore/gym (Python)",
        "original_commit": _git_commit(gym_dir),
        "steps": steps,
        "num_nodes": a.num_nodes,
        "batch_size": a.batch_size,
        "lr": a.demo_lr if (a.strategy == "demo" and a.demo_lr is not None) else a.lr,
        "loop_s": round(loop_s, 3),
        "fit_s": round(t_fit_end - t_fit, 2),
        "final_eval_s": round(t_end - t_fit_end, 2),
        "val_examples": metrics["val_examples"],
        "peak_pss_mib": round(sampler.peak_pss / 2**20) if sampler.peak_pss else None,
        "peak_rss_per_node_mib": [round(ranks[r]["peak_rss_bytes"] / 2**20)
                                  for r in sorted(ranks)],
        "processes": sampler.max_procs,
        "torch": torch.__version__,
        "device": a.device,
        "final_train_loss": r0.get("final_train_loss"),
        "torch_threads_per_node": a.threads if a.threads > 0 else "torch default",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_1m_at_start": round(loadavg, 2) if loadavg is not None else None,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run_name": run_name,
    })
    if a.strategy in ("diloco", "fedavg", "sparta-diloco"):
        result["H"] = a.H
    if a.strategy in ("sparta", "sparta-diloco"):
        result["p_sparta"] = a.p_sparta
    if a.task == "nanogpt":
        result["tokens_per_s"] = round(
            steps / loop_s * a.num_nodes * a.batch_size * a.block_size)
    result = {k: v for k, v in result.items() if v is not None}

    line = json.dumps(result)
    sys.stderr.write("\n")  # past the end of the progress bar
    sys.stderr.flush()
    print(line, flush=True)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
