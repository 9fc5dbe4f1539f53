//! A checkpoint as a safetensors file: every node's state as typed, named tensors that any
//! safetensors reader (Python's `safetensors`, PyTorch, the `safetensors` crate) opens.
//!
//! # Names
//!
//! | tensor | dtype | what |
//! |---|---|---|
//! | `node{r}/model/{path}` | F32 | the model's float tensors (parameters, running statistics), Burn's layout |
//! | `node{r}/param_ids` | U64 | the trainable parameters' ids, which key optimizer state |
//! | `node{r}/strategy/{key}` | F32 | a strategy buffer (outer momentum, error feedback, …) |
//! | `node{r}/strategy/{key}` | U64, shape `[]` | a strategy counter |
//! | `node{r}/strategy/{key}/{tensor}` | as saved | an optimizer's state (`…/inner/optimizer/fc1.weight/momentum.moment_1`) |
//! | `node{r}/strategy/{key}/.scalars/{name}` | I64, U64, F64 or U8, shape `[]` | the optimizer record's scalars |
//! | `node{r}/loader`, `node{r}/comm` | U64 | data position and fingerprint; traffic counters |
//! | `node{r}/rng/seed`, `node{r}/rng/position` | U8, U64 | the node's random stream |
//! | `node{r}/clock` | F64 | simulated now, compute, comm, idle, down, link free |
//! | `node{r}/ledger`, `records` | U8 | the fault ledger and the logs so far (MessagePack) |
//!
//! The `__metadata__` holds `format`, `next_step`, `run_name`, the run's `identity` and
//! `shard` (JSON), `nodes` (JSON: per node the model tensors' order, which strategy keys hold
//! an optimizer record and its tensors, and for readers the seed and the simulated time) and
//! `crc32`, the checksum of the data section, so a file altered by one byte is refused.
//! Floats are never written as text: JSON would round them.

use super::{Checkpoint, NodeCheckpoint, Shard};
use crate::comm::{CommStats, SimulatedTime};
use crate::error::{GymError, Result};
use crate::state::record::StateDict;
use ::safetensors::tensor::TensorView;
use ::safetensors::{Dtype, SafeTensors, View};
use burn::tensor::{Bytes, DType};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The `format` this module writes and reads.
pub const FORMAT: &str = "exogym-checkpoint/2";

/// Where the data section's checksum goes: written as zeros, then filled in once the data
/// section exists (the header precedes it and keeps its length).
const CRC_PLACEHOLDER: &str = "crc32:00000000";

/// One tensor to write.
struct Owned {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for Owned {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// `values` little-endian, as a tensor of `dtype` and `shape`.
fn tensor<T: Copy, const N: usize>(
    dtype: Dtype,
    values: &[T],
    shape: Vec<usize>,
    le_bytes: fn(T) -> [u8; N],
) -> Owned {
    Owned {
        dtype,
        shape,
        data: values.iter().flat_map(|&v| le_bytes(v)).collect(),
    }
}

fn f32s(values: &[f32], shape: Vec<usize>) -> Owned {
    tensor(Dtype::F32, values, shape, f32::to_le_bytes)
}

fn u64s(values: &[u64]) -> Owned {
    tensor(Dtype::U64, values, vec![values.len()], u64::to_le_bytes)
}

fn f64s(values: &[f64]) -> Owned {
    tensor(Dtype::F64, values, vec![values.len()], f64::to_le_bytes)
}

fn u8s(data: Vec<u8>) -> Owned {
    Owned {
        dtype: Dtype::U8,
        shape: vec![data.len()],
        data,
    }
}

fn scalar(dtype: Dtype, data: Vec<u8>) -> Owned {
    Owned {
        dtype,
        shape: Vec::new(),
        data,
    }
}

/// What the metadata says of one node.
#[derive(Debug, Serialize, Deserialize)]
struct NodeLayout {
    rank: usize,
    /// The model tensors' paths, in the order of [`NodeCheckpoint::model`].
    model: Vec<String>,
    /// The strategy keys that hold an optimizer record, written as its tensors.
    records: BTreeMap<String, RecordLayout>,
    /// For readers: the node's random seed (hex) and simulated time.
    seed: String,
    simulated_s: Option<f64>,
}

/// An optimizer record (Burn's burn-pack bytes) taken apart.
#[derive(Debug, Serialize, Deserialize)]
struct RecordLayout {
    tensors: Vec<RecordTensor>,
    scalars: Vec<String>,
    metadata: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct RecordTensor {
    /// The tensor's name in the record (`{param id}.momentum.moment_1`).
    name: String,
    /// Its name in the file, under the record's key: the parameter's path in place of its
    /// id where the id is a model parameter's (`fc1.weight/momentum.moment_1`).
    stored: String,
    dtype: DType,
    shape: Vec<usize>,
    param_id: Option<u64>,
}

/// The file's bytes for `checkpoint`.
pub(super) fn encode(checkpoint: &Checkpoint) -> Result<Vec<u8>> {
    let fail = |e: &dyn std::fmt::Display| GymError::Checkpoint(format!("cannot encode: {e}"));
    let first = checkpoint.shard.map_or(0, |s| s.first_rank);
    let mut tensors: Vec<(String, Owned)> = Vec::new();
    let mut layouts = Vec::with_capacity(checkpoint.nodes.len());
    for (i, node) in checkpoint.nodes.iter().enumerate() {
        let paths: HashMap<u64, &str> = node
            .param_ids
            .iter()
            .zip(&checkpoint.identity.parameters)
            .map(|(&id, (path, _))| (id, path.as_str()))
            .collect();
        layouts.push(encode_node(first + i, node, &paths, &mut tensors)?);
    }
    let records = (
        &checkpoint.train,
        &checkpoint.validation,
        &checkpoint.correlation,
    );
    tensors.push((
        "records".into(),
        u8s(rmp_serde::to_vec(&records).map_err(|e| fail(&e))?),
    ));
    let metadata = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("next_step".into(), checkpoint.next_step.to_string()),
        ("run_name".into(), checkpoint.run_name.clone()),
        (
            "identity".into(),
            to_json(&checkpoint.identity).map_err(|e| fail(&e))?,
        ),
        (
            "shard".into(),
            to_json(&checkpoint.shard).map_err(|e| fail(&e))?,
        ),
        ("nodes".into(), to_json(&layouts).map_err(|e| fail(&e))?),
        ("crc32".into(), CRC_PLACEHOLDER.into()),
    ]);
    let mut bytes = ::safetensors::serialize(tensors, Some(metadata)).map_err(|e| fail(&e))?;
    canonical_header(&mut bytes);
    let header_end = 8 + header_len(&bytes).ok_or_else(|| fail(&"no header"))?;
    let crc = format!("crc32:{:08x}", crc32fast::hash(&bytes[header_end..]));
    let at = find(&bytes[..header_end], CRC_PLACEHOLDER.as_bytes())
        .ok_or_else(|| fail(&"no checksum field in the header"))?;
    bytes[at..at + crc.len()].copy_from_slice(crc.as_bytes());
    Ok(bytes)
}

/// Adds node `rank`'s tensors; returns what the metadata says of it.
fn encode_node(
    rank: usize,
    node: &NodeCheckpoint,
    paths: &HashMap<u64, &str>,
    tensors: &mut Vec<(String, Owned)>,
) -> Result<NodeLayout> {
    let at = format!("node{rank}");
    let covered: usize = node
        .model_tensors
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .sum();
    if covered != node.model.len() {
        return Err(GymError::Checkpoint(format!(
            "node {rank}'s model tensors hold {covered} values and its model {}",
            node.model.len()
        )));
    }
    let mut offset = 0;
    for (path, shape) in &node.model_tensors {
        let n = shape.iter().product::<usize>();
        let values = &node.model[offset..offset + n];
        tensors.push((format!("{at}/model/{path}"), f32s(values, shape.clone())));
        offset += n;
    }
    tensors.push((format!("{at}/param_ids"), u64s(&node.param_ids)));
    let (values, buffers, numbers) = node.strategy.parts();
    for (key, v) in values {
        tensors.push((format!("{at}/strategy/{key}"), f32s(v, vec![v.len()])));
    }
    for (key, v) in numbers {
        tensors.push((
            format!("{at}/strategy/{key}"),
            scalar(Dtype::U64, v.to_le_bytes().to_vec()),
        ));
    }
    let mut records = BTreeMap::new();
    for (key, buffer) in buffers {
        let name = format!("{at}/strategy/{key}");
        match take_apart(&name, buffer, paths) {
            Some((layout, parts)) => {
                records.insert(key.clone(), layout);
                tensors.extend(parts);
            }
            None => tensors.push((name, u8s(buffer.to_vec()))),
        }
    }
    let (epoch, position, fingerprint) = node.loader;
    tensors.push((
        format!("{at}/loader"),
        u64s(&[epoch as u64, position as u64, fingerprint]),
    ));
    let (seed, stream, word) = node.rng;
    tensors.push((format!("{at}/rng/seed"), u8s(seed.to_vec())));
    tensors.push((
        format!("{at}/rng/position"),
        u64s(&[stream, word as u64, (word >> 64) as u64]),
    ));
    let c = &node.comm;
    tensors.push((
        format!("{at}/comm"),
        u64s(&[
            c.bytes_sent,
            c.bytes_received,
            c.all_reduce_calls,
            c.broadcast_calls,
            c.all_gather_calls,
            c.barrier_calls,
        ]),
    ));
    if let Some((t, link_free)) = node.clock {
        tensors.push((
            format!("{at}/clock"),
            f64s(&[
                t.now_s,
                t.compute_s,
                t.comm_s,
                t.idle_s,
                t.down_s,
                link_free,
            ]),
        ));
    }
    let ledger = rmp_serde::to_vec(&node.ledger)
        .map_err(|e| GymError::Checkpoint(format!("cannot encode node {rank}'s ledger: {e}")))?;
    tensors.push((format!("{at}/ledger"), u8s(ledger)));
    Ok(NodeLayout {
        rank,
        model: node.model_tensors.iter().map(|(p, _)| p.clone()).collect(),
        records,
        seed: seed.iter().map(|b| format!("{b:02x}")).collect(),
        simulated_s: node.clock.map(|(t, _)| t.now_s),
    })
}

/// An optimizer record as named tensors, when it is one and putting it back together gives
/// the same bytes; otherwise `None` and the buffer is written as it is.
fn take_apart(
    name: &str,
    buffer: &[u8],
    paths: &HashMap<u64, &str>,
) -> Option<(RecordLayout, Vec<(String, Owned)>)> {
    let reader = burn_pack::Reader::from_bytes(Bytes::from_bytes_vec(buffer.to_vec())).ok()?;
    let scalars = reader.scalars().clone();
    let metadata = reader.metadata().clone();
    let mut parts = Vec::new();
    let mut layout = RecordLayout {
        tensors: Vec::new(),
        scalars: scalars.keys().cloned().collect(),
        metadata,
    };
    for tensor in reader.into_tensors().ok()? {
        let (tname, dtype, shape, param_id, bytes) = tensor.into_parts().ok()?;
        let shape = shape.to_vec();
        let data = bytes.to_vec();
        let owned = match to_safetensors(dtype) {
            Some(d) => Owned {
                dtype: d,
                shape: shape.clone(),
                data,
            },
            None => u8s(data),
        };
        let stored = tname
            .split_once('.')
            .and_then(|(id, rest)| Some(format!("{}/{rest}", paths.get(&id.parse().ok()?)?)))
            .unwrap_or_else(|| tname.clone());
        parts.push((format!("{name}/{stored}"), owned));
        layout.tensors.push(RecordTensor {
            name: tname,
            stored,
            dtype,
            shape,
            param_id,
        });
    }
    for (key, value) in &scalars {
        let s = match *value {
            burn_pack::Scalar::Int(v) => scalar(Dtype::I64, v.to_le_bytes().to_vec()),
            burn_pack::Scalar::UInt(v) => scalar(Dtype::U64, v.to_le_bytes().to_vec()),
            burn_pack::Scalar::Float(v) => scalar(Dtype::F64, v.to_le_bytes().to_vec()),
            burn_pack::Scalar::Bool(v) => scalar(Dtype::U8, vec![v as u8]),
        };
        parts.push((format!("{name}/.scalars/{key}"), s));
    }
    let views: BTreeMap<String, (Dtype, &[u8])> = parts
        .iter()
        .map(|(n, o)| (n.clone(), (o.dtype, o.data.as_slice())))
        .collect();
    let rebuilt = put_together(name, &layout, |n| views.get(n).copied()).ok()?;
    (rebuilt == buffer).then_some((layout, parts))
}

/// The optimizer record `layout` describes, from the tensors under `name`.
fn put_together<'a>(
    name: &str,
    layout: &RecordLayout,
    get: impl Fn(&str) -> Option<(Dtype, &'a [u8])>,
) -> std::result::Result<Vec<u8>, String> {
    let mut tensors = Vec::with_capacity(layout.tensors.len());
    for t in &layout.tensors {
        let full = format!("{name}/{}", t.stored);
        let (_, data) = get(&full).ok_or_else(|| format!("no tensor `{full}`"))?;
        tensors.push(burn_pack::Tensor::new(
            t.name.clone(),
            t.dtype,
            t.shape.clone(),
            t.param_id,
            Bytes::from_bytes_vec(data.to_vec()),
        ));
    }
    let mut writer = burn_pack::Writer::new(tensors);
    for key in &layout.scalars {
        let full = format!("{name}/.scalars/{key}");
        let (dtype, data) = get(&full).ok_or_else(|| format!("no scalar `{full}`"))?;
        let bad = || format!("scalar `{full}` is not one value");
        let value = match dtype {
            Dtype::I64 => {
                burn_pack::Scalar::Int(i64::from_le_bytes(data.try_into().map_err(|_| bad())?))
            }
            Dtype::U64 => {
                burn_pack::Scalar::UInt(u64::from_le_bytes(data.try_into().map_err(|_| bad())?))
            }
            Dtype::F64 => {
                burn_pack::Scalar::Float(f64::from_le_bytes(data.try_into().map_err(|_| bad())?))
            }
            Dtype::U8 if data.len() == 1 => burn_pack::Scalar::Bool(data[0] != 0),
            _ => return Err(bad()),
        };
        writer = writer.with_scalar(key, value);
    }
    for (key, value) in &layout.metadata {
        writer = writer.with_metadata(key, value);
    }
    writer
        .into_bytes()
        .map(|b| b.to_vec())
        .map_err(|e| e.to_string())
}

fn to_safetensors(dtype: DType) -> Option<Dtype> {
    Some(match dtype {
        DType::F64 => Dtype::F64,
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::I16 => Dtype::I16,
        DType::I8 => Dtype::I8,
        DType::U64 => Dtype::U64,
        DType::U32 => Dtype::U32,
        DType::U16 => Dtype::U16,
        DType::U8 => Dtype::U8,
        _ => return None,
    })
}

/// The checkpoint in a file's `bytes`; `file` names it in errors.
pub(super) fn decode(bytes: &[u8], file: &Path) -> Result<Checkpoint> {
    let bad = |why: String| {
        GymError::Checkpoint(format!(
            "{} is not a usable checkpoint: {why}",
            file.display()
        ))
    };
    let st = SafeTensors::deserialize(bytes).map_err(|e| {
        bad(format!(
            "it is not a whole safetensors file ({e}): truncated, padded or another kind of file"
        ))
    })?;
    let (n, header) = SafeTensors::read_metadata(bytes)
        .map_err(|e| bad(format!("its header cannot be read: {e}")))?;
    let empty = HashMap::new();
    let meta = header.metadata().as_ref().unwrap_or(&empty);
    let field = |key: &str| {
        meta.get(key)
            .ok_or_else(|| bad(format!("its metadata has no `{key}`")))
    };
    let format = field("format")?;
    if format != FORMAT {
        return Err(bad(format!(
            "it is in format `{format}`, this version reads `{FORMAT}`"
        )));
    }
    let crc = format!("crc32:{:08x}", crc32fast::hash(&bytes[8 + n..]));
    if field("crc32")? != &crc {
        return Err(bad(
            "its checksum does not match (the file was altered)".into()
        ));
    }
    fn parse<T: serde::de::DeserializeOwned>(
        text: &str,
        key: &str,
    ) -> std::result::Result<T, String> {
        serde_json::from_str(text).map_err(|e| format!("its `{key}` cannot be read: {e}"))
    }
    let next_step: usize = field("next_step")?
        .parse()
        .map_err(|e| bad(format!("its `next_step`: {e}")))?;
    let identity = parse(field("identity")?, "identity").map_err(bad)?;
    let shard: Option<Shard> = parse(field("shard")?, "shard").map_err(bad)?;
    let layouts: Vec<NodeLayout> = parse(field("nodes")?, "nodes").map_err(bad)?;
    let views: BTreeMap<String, TensorView<'_>> = st.tensors().into_iter().collect();
    let nodes = layouts
        .iter()
        .map(|layout| decode_node(layout, &views).map_err(&bad))
        .collect::<Result<Vec<_>>>()?;
    let records = views
        .get("records")
        .ok_or_else(|| bad("no `records`".into()))?;
    let (train, validation, correlation) = rmp_serde::from_slice(records.data())
        .map_err(|e| bad(format!("its `records` cannot be read: {e}")))?;
    Ok(Checkpoint {
        next_step,
        identity,
        run_name: field("run_name")?.clone(),
        nodes,
        train,
        validation,
        correlation,
        shard,
    })
}

fn decode_node(
    layout: &NodeLayout,
    views: &BTreeMap<String, TensorView<'_>>,
) -> std::result::Result<NodeCheckpoint, String> {
    let at = format!("node{}", layout.rank);
    let get = |name: &str| views.get(name).ok_or_else(|| format!("no tensor `{name}`"));
    let typed = |name: &str, dtype: Dtype| -> std::result::Result<&[u8], String> {
        let view = get(name)?;
        if view.dtype() != dtype {
            return Err(format!("`{name}` is {:?}, not {dtype:?}", view.dtype()));
        }
        Ok(view.data())
    };
    let as_u64 = |name: &str| -> std::result::Result<Vec<u64>, String> {
        Ok(typed(name, Dtype::U64)?
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect())
    };
    let as_f32 = |data: &[u8]| -> Vec<f32> {
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect()
    };
    let fixed = |name: &str, len: usize| -> std::result::Result<Vec<u64>, String> {
        let v = as_u64(name)?;
        (v.len() == len)
            .then_some(v)
            .ok_or_else(|| format!("`{name}` holds the wrong number of values"))
    };

    let mut model = Vec::new();
    let mut model_tensors = Vec::with_capacity(layout.model.len());
    for path in &layout.model {
        let name = format!("{at}/model/{path}");
        model.extend(as_f32(typed(&name, Dtype::F32)?));
        model_tensors.push((path.clone(), get(&name)?.shape().to_vec()));
    }

    let prefix = format!("{at}/strategy/");
    let mut values = BTreeMap::new();
    let mut buffers = BTreeMap::new();
    let mut numbers = BTreeMap::new();
    for (key, record) in &layout.records {
        let name = format!("{prefix}{key}");
        let bytes = put_together(&name, record, |n| {
            views.get(n).map(|v| (v.dtype(), v.data()))
        })?;
        buffers.insert(key.clone(), bytes);
    }
    let in_record = |key: &str| {
        layout.records.keys().any(|r| {
            key.strip_prefix(r.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
        })
    };
    for (name, view) in views.range(prefix.clone()..) {
        let Some(key) = name.strip_prefix(&prefix) else {
            break;
        };
        if in_record(key) {
            continue;
        }
        match (view.dtype(), view.shape()) {
            (Dtype::F32, _) => {
                values.insert(key.to_string(), as_f32(view.data()));
            }
            (Dtype::U64, []) => {
                let v = u64::from_le_bytes(view.data().try_into().map_err(|_| name.clone())?);
                numbers.insert(key.to_string(), v);
            }
            (Dtype::U8, _) => {
                buffers.insert(key.to_string(), view.data().to_vec());
            }
            (dtype, _) => return Err(format!("`{name}` has an unexpected dtype {dtype:?}")),
        }
    }

    let loader = fixed(&format!("{at}/loader"), 3)?;
    let seed: [u8; 32] = typed(&format!("{at}/rng/seed"), Dtype::U8)?
        .try_into()
        .map_err(|_| format!("`{at}/rng/seed` is not 32 bytes"))?;
    let position = fixed(&format!("{at}/rng/position"), 3)?;
    let comm = fixed(&format!("{at}/comm"), 6)?;
    let clock_name = format!("{at}/clock");
    let clock = match views.get(&clock_name) {
        None => None,
        Some(_) => {
            let c: Vec<f64> = typed(&clock_name, Dtype::F64)?
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            let [now_s, compute_s, comm_s, idle_s, down_s, link_free] = c[..] else {
                return Err(format!("`{clock_name}` holds the wrong number of values"));
            };
            Some((
                SimulatedTime {
                    now_s,
                    compute_s,
                    comm_s,
                    idle_s,
                    down_s,
                },
                link_free,
            ))
        }
    };
    let ledger = rmp_serde::from_slice(typed(&format!("{at}/ledger"), Dtype::U8)?)
        .map_err(|e| format!("`{at}/ledger` cannot be read: {e}"))?;
    Ok(NodeCheckpoint {
        model,
        model_tensors,
        param_ids: as_u64(&format!("{at}/param_ids"))?,
        strategy: StateDict::from_parts(values, buffers, numbers),
        loader: (loader[0] as usize, loader[1] as usize, loader[2]),
        rng: (
            seed,
            position[0],
            position[1] as u128 | (position[2] as u128) << 64,
        ),
        comm: CommStats {
            bytes_sent: comm[0],
            bytes_received: comm[1],
            all_reduce_calls: comm[2],
            broadcast_calls: comm[3],
            all_gather_calls: comm[4],
            barrier_calls: comm[5],
        },
        clock,
        ledger,
    })
}

/// Rewrites a safetensors file's header with its keys sorted. The format keeps
/// `__metadata__` in a `HashMap`, whose order changes from process to process: sorted, the
/// same tensors and metadata are the same bytes in every run. The header keeps its length
/// (the same JSON in another order), so the data offsets hold; left as it is otherwise.
pub(crate) fn canonical_header(bytes: &mut [u8]) {
    let Some(n) = header_len(bytes) else { return };
    let Some(header) = bytes.get(8..8 + n) else {
        return;
    };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(header) else {
        return;
    };
    let Ok(sorted) = serde_json::to_string(&value) else {
        return;
    };
    // The format pads the header with spaces to a multiple of 8 bytes.
    let unpadded = header.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
    if sorted.len() == unpadded {
        bytes[8..8 + unpadded].copy_from_slice(sorted.as_bytes());
    }
}

/// The header's length, from a safetensors file's first 8 bytes.
fn header_len(bytes: &[u8]) -> Option<usize> {
    Some(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn to_json<T: Serialize>(value: &T) -> serde_json::Result<String> {
    serde_json::to_string(value)
}
