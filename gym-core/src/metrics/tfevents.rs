//! TensorBoard's event files, written by hand: TFRecord framing (a length, a masked CRC-32C
//! of it, the data, a masked CRC-32C of the data) around protocol-buffer `Event` messages
//! (`tensorboard/compat/proto/event.proto`, `summary.proto`), with scalars as
//! `simple_value`s and hyper-parameters as the hparams plugin's `session_start_info`
//! (`tensorboard/plugins/hparams/plugin_data.proto`).
//!
//! No maintained Rust crate writes these; the format is small. An [`EventWriter`] writes
//! one file, `events.out.tfevents.<seconds>.<host>`, that TensorBoard (`tensorboard
//! --logdir`) and its Python readers load.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The CRC-32C (Castagnoli) table, reflected polynomial 0x82F63B78.
const CRC32C_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// The CRC-32C (Castagnoli) of `data`, as TFRecord files check their records with.
pub fn crc32c(data: &[u8]) -> u32 {
    !data.iter().fold(!0u32, |crc, &b| {
        CRC32C_TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8)
    })
}

/// The masked CRC-32C TFRecord files store: the CRC rotated right by 15 bits plus
/// 0xa282ead8 (so that a CRC of data holding CRCs stays well distributed).
pub fn masked_crc32c(data: &[u8]) -> u32 {
    crc32c(data).rotate_right(15).wrapping_add(0xa282_ead8)
}

/// `data` framed as one TFRecord: its length (u64, little-endian), the masked CRC-32C of
/// those 8 bytes, the data, and the masked CRC-32C of the data.
pub fn tfrecord(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// A protocol-buffer message being encoded: fields appended in order.
#[derive(Debug, Default, Clone)]
struct Message(Vec<u8>);

impl Message {
    /// A base-128 varint, least significant group first.
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8 & 0x7F) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    /// A field's key: its number and wire type.
    fn key(&mut self, field: u32, wire_type: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire_type));
    }

    /// An `int64` field (negative values take ten bytes, as protobuf encodes them).
    fn int64(mut self, field: u32, v: i64) -> Self {
        self.key(field, 0);
        self.varint(v as u64);
        self
    }

    /// A `bool` field.
    fn bool(self, field: u32, v: bool) -> Self {
        self.int64(field, i64::from(v))
    }

    /// A `double` field.
    fn double(mut self, field: u32, v: f64) -> Self {
        self.key(field, 1);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A `float` field.
    fn float(mut self, field: u32, v: f32) -> Self {
        self.key(field, 5);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A `bytes` or `string` field.
    fn bytes(mut self, field: u32, v: &[u8]) -> Self {
        self.key(field, 2);
        self.varint(v.len() as u64);
        self.0.extend_from_slice(v);
        self
    }

    /// A `string` field.
    fn string(self, field: u32, v: &str) -> Self {
        self.bytes(field, v.as_bytes())
    }

    /// An embedded message field.
    fn message(self, field: u32, m: &Message) -> Self {
        self.bytes(field, &m.0)
    }
}

/// A hyper-parameter's value: the scalars the hparams plugin takes
/// (`google.protobuf.Value`'s number, string and bool).
#[derive(Debug, Clone, PartialEq)]
pub enum HParam {
    /// A number (`number_value`).
    Number(f64),
    /// A string (`string_value`).
    Text(String),
    /// A flag (`bool_value`).
    Bool(bool),
}

impl HParam {
    /// As a `google.protobuf.Value` (`struct.proto`: number 2, string 3, bool 4).
    fn message(&self) -> Message {
        match self {
            HParam::Number(v) => Message::default().double(2, *v),
            HParam::Text(s) => Message::default().string(3, s),
            HParam::Bool(b) => Message::default().bool(4, *b),
        }
    }
}

/// The hyper-parameters a JSON value holds, flattened: an object's members named by their
/// path (`inner.lr`), arrays of scalars joined with commas (`1,1,0.5`), nulls and empty
/// arrays left out. A scalar at the top is named `value`.
pub fn hparams_from_json(value: &serde_json::Value) -> Vec<(String, HParam)> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, HParam)>) {
        use serde_json::Value as J;
        let name = |key: &str| {
            if prefix.is_empty() {
                key.to_string()
            } else {
                format!("{prefix}.{key}")
            }
        };
        match v {
            J::Null => {}
            J::Bool(b) => out.push((prefix.to_string(), HParam::Bool(*b))),
            J::Number(n) => out.push((
                prefix.to_string(),
                HParam::Number(n.as_f64().unwrap_or(0.0)),
            )),
            J::String(s) => out.push((prefix.to_string(), HParam::Text(s.clone()))),
            J::Array(items) if items.is_empty() => {}
            J::Array(items) => {
                let text: Vec<String> = items
                    .iter()
                    .map(|i| match i {
                        J::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect();
                out.push((prefix.to_string(), HParam::Text(text.join(","))));
            }
            J::Object(members) => {
                for (key, member) in members {
                    walk(&name(key), member, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    let top = if value.is_object() { "" } else { "value" };
    walk(top, value, &mut out);
    out
}

/// The tag of the hparams plugin's session summary (`metadata.SESSION_START_INFO_TAG`).
pub const SESSION_START_INFO_TAG: &str = "_hparams_/session_start_info";

/// The `Summary` holding one scalar per `(tag, value)`, each a `simple_value` (an f32).
fn scalars_summary(scalars: &[(&str, f64)]) -> Message {
    scalars
        .iter()
        .fold(Message::default(), |summary, (tag, v)| {
            let value = Message::default().string(1, tag).float(2, *v as f32);
            summary.message(1, &value)
        })
}

/// The `Summary` of the hparams plugin's `session_start_info`: the session's
/// hyper-parameters and start time, in the plugin's metadata, over an empty float tensor
/// (as `tensorboard.plugins.hparams.summary` writes it).
fn session_start_summary(hparams: &[(String, HParam)], start_time_secs: f64) -> Message {
    let info = hparams
        .iter()
        .fold(Message::default(), |info, (name, value)| {
            let entry = Message::default()
                .string(1, name)
                .message(2, &value.message());
            info.message(1, &entry)
        })
        .double(5, start_time_secs);
    // HParamsPluginData: version 0 (not written), session_start_info = 3.
    let plugin_data = Message::default().message(3, &info);
    let metadata = Message::default().message(
        1,
        &Message::default()
            .string(1, "hparams")
            .bytes(2, &plugin_data.0),
    );
    // TensorProto: dtype DT_FLOAT (1), shape [0] (a dimension of size 0, encoded empty).
    let null_tensor = Message::default()
        .int64(1, 1)
        .message(2, &Message::default().message(2, &Message::default()));
    let value = Message::default()
        .string(1, SESSION_START_INFO_TAG)
        .message(8, &null_tensor)
        .message(9, &metadata);
    Message::default().message(1, &value)
}

/// An `Event`: its wall time, step (left out at 0, proto3's default), and one of a file
/// version or a summary.
fn event(wall_time: f64, step: i64, what: What<'_>) -> Vec<u8> {
    let e = Message::default().double(1, wall_time);
    let e = if step == 0 { e } else { e.int64(2, step) };
    match what {
        What::FileVersion(v) => e.string(3, v),
        What::Summary(s) => e.message(5, s),
    }
    .0
}

/// What an `Event` carries.
enum What<'a> {
    FileVersion(&'a str),
    Summary(&'a Message),
}

/// Seconds since the Unix epoch, as event files time their events.
pub fn wall_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This machine's name, for event file names (`localhost` when it cannot be read).
fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let safe: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
        .collect();
    if safe.is_empty() {
        "localhost".into()
    } else {
        safe
    }
}

/// Whether `name` is an event file's (TensorBoard loads the files whose names hold
/// `tfevents`).
pub fn is_event_file(name: &str) -> bool {
    name.starts_with("events.out.tfevents.")
}

/// One TensorBoard event file, written event by event (each flushed as written, so that a
/// TensorBoard watching the folder shows a run as it trains).
pub struct EventWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// Creates `dir` if needed and a new event file in it,
    /// `events.out.tfevents.<seconds>.<host>`, starting with the `brain.Event:2` version
    /// event. Errors name the path.
    pub fn create(dir: &Path) -> crate::Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| crate::GymError::io(dir, e))?;
        let now = wall_time();
        let path = dir.join(format!(
            "events.out.tfevents.{:010}.{}",
            now as u64,
            hostname()
        ));
        let file = File::create(&path).map_err(|e| crate::GymError::io(&path, e))?;
        let mut writer = EventWriter {
            out: BufWriter::new(file),
            path,
        };
        writer.write(&event(now, 0, What::FileVersion("brain.Event:2")))?;
        Ok(writer)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes scalars `(tag, value)` at `step` (one event; TensorBoard stores each as an
    /// f32).
    pub fn scalars(&mut self, step: u64, scalars: &[(&str, f64)]) -> crate::Result<()> {
        if scalars.is_empty() {
            return Ok(());
        }
        let summary = scalars_summary(scalars);
        let step = i64::try_from(step).unwrap_or(i64::MAX);
        self.write(&event(wall_time(), step, What::Summary(&summary)))
    }

    /// Writes the hparams plugin's session start: `hparams` for this run (TensorBoard's
    /// HParams tab lists every run of a folder that has one, with its scalars as metrics).
    pub fn hparams(&mut self, hparams: &[(String, HParam)]) -> crate::Result<()> {
        let now = wall_time();
        let summary = session_start_summary(hparams, now);
        self.write(&event(now, 0, What::Summary(&summary)))
    }

    /// Frames `event` as a record, writes it and flushes.
    fn write(&mut self, event: &[u8]) -> crate::Result<()> {
        self.out
            .write_all(&tfrecord(event))
            .and_then(|_| self.out.flush())
            .map_err(|e| crate::GymError::io(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn crc32c_matches_the_check_value_and_masks_as_tensorflow_does() {
        // The standard check value of CRC-32C (Castagnoli).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        // From tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c.
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
        assert_eq!(masked_crc32c(b""), 0xa282_ead8);
    }

    #[test]
    fn varints_and_fields_encode_as_protobuf_does() {
        let varint = |v: u64| {
            let mut m = Message::default();
            m.varint(v);
            m.0
        };
        assert_eq!(varint(0), [0x00]);
        assert_eq!(varint(1), [0x01]);
        assert_eq!(varint(127), [0x7f]);
        assert_eq!(varint(128), [0x80, 0x01]);
        assert_eq!(varint(300), [0xac, 0x02]);
        assert_eq!(varint(u64::MAX), {
            let mut v = vec![0xff; 9];
            v.push(0x01);
            v
        });
        // A negative int64 is its two's complement: ten bytes.
        assert_eq!(Message::default().int64(2, -1).0.len(), 11);
        // Key 1 (wire type 1), then 1.5 as a little-endian double.
        assert_eq!(
            hex(&Message::default().double(1, 1.5).0),
            "09000000000000f83f"
        );
        // Key 2 (wire type 5), then 0.25 as a little-endian float.
        assert_eq!(hex(&Message::default().float(2, 0.25).0), "150000803e");
        assert_eq!(hex(&Message::default().string(1, "ab").0), "0a026162");
    }

    /// The bytes Python's `tensorboard` package writes for the same events
    /// (`event_pb2.Event(...).SerializeToString()` and its `RecordWriter`).
    #[test]
    fn events_and_records_match_tensorboards_own_writer() {
        let version = event(1.5, 0, What::FileVersion("brain.Event:2"));
        assert_eq!(
            hex(&version),
            "09000000000000f83f1a0d627261696e2e4576656e743a32"
        );
        let summary = scalars_summary(&[("train/loss", 0.25)]);
        assert_eq!(
            hex(&event(1.5, 3, What::Summary(&summary))),
            "09000000000000f83f10032a130a110a0a747261696e2f6c6f7373150000803e"
        );
        assert_eq!(
            hex(&tfrecord(&version)),
            "1800000000000000a37f4b22\
             09000000000000f83f1a0d627261696e2e4576656e743a32\
             2a28646c"
        );
    }

    #[test]
    fn the_session_start_holds_the_null_tensor_and_the_plugin_name() {
        let bytes = session_start_summary(&[("lr".into(), HParam::Number(0.5))], 2.0).0;
        let text = hex(&bytes);
        // metadata.NULL_TENSOR serialised: DT_FLOAT, shape [0].
        assert!(text.contains("4206080112021200"), "{text}");
        assert!(text.contains(&hex(b"hparams")), "{text}");
        assert!(
            text.contains(&hex(SESSION_START_INFO_TAG.as_bytes())),
            "{text}"
        );
    }

    #[test]
    fn json_flattens_into_scalar_hparams() {
        let v = serde_json::json!({
            "strategy": "diloco",
            "num_nodes": 4,
            "inner": { "lr": 0.001, "cosine": false },
            "node_speed": [1, 0.5],
            "faults": null,
            "empty": [],
        });
        let mut got = hparams_from_json(&v);
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            got,
            vec![
                ("inner.cosine".into(), HParam::Bool(false)),
                ("inner.lr".into(), HParam::Number(0.001)),
                ("node_speed".into(), HParam::Text("1,0.5".into())),
                ("num_nodes".into(), HParam::Number(4.0)),
                ("strategy".into(), HParam::Text("diloco".into())),
            ]
        );
    }

    #[test]
    fn a_writer_frames_every_event_with_checked_lengths() {
        let dir = std::env::temp_dir().join(format!("gym-tfevents-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let mut w = EventWriter::create(&dir).unwrap();
        w.scalars(0, &[("a", 1.0), ("b", 2.0)]).unwrap();
        w.hparams(&[("k".into(), HParam::Text("v".into()))])
            .unwrap();
        let path = w.path().to_path_buf();
        drop(w);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(is_event_file(&name), "{name}");
        let bytes = std::fs::read(&path).unwrap();
        let mut at = 0;
        let mut records = 0;
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(&bytes[at..at + 8]));
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(data));
            at += 16 + len;
            records += 1;
        }
        assert_eq!((at, records), (bytes.len(), 3));
        std::fs::remove_dir_all(&dir).ok();
    }
}
