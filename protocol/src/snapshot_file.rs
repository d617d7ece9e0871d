//! Snapshots streamed to and from files, in the bytes of [`Snapshot::encode`].
//!
//! [`SnapshotView::write_to`] encodes from borrowed tensors (the trainer's own) through
//! zstd straight into a file, and [`read_snapshot`] checks a file's digest and decodes it
//! into tensors; each holds buffers of a fixed size besides the tensors, never the
//! uncompressed state or the encoded file whole. A 124M-parameter model with AdamW state
//! is about 1.5 GB of state: [`Snapshot::encode`] holds it two more times over while it
//! encodes, a checkpoint written from a view none.
//!
//! The digest covers the header's lengths, which are known only once the body is
//! compressed, so the writer reads its body back from the file (the page cache) to hash it.

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};

use sha2::{Digest, Sha256};

use crate::snapshot::{
    NamedTensor, SNAPSHOT_HEADER_LEN, Snapshot, SnapshotError, SnapshotLimits, digested_prefix,
    parse_header,
};

/// Bytes converted or hashed at a time.
const BUFFER: usize = 1 << 16;

/// One tensor of a [`SnapshotView`], borrowed.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// The tensor's name, at most 65,535 bytes of UTF-8.
    pub name: &'a str,
    /// Its values, all finite.
    pub data: TensorData<'a>,
}

impl<'a> TensorView<'a> {
    /// A tensor whose values are `f32`s in memory.
    pub fn floats(name: &'a str, values: &'a [f32]) -> TensorView<'a> {
        TensorView {
            name,
            data: TensorData::Floats(values),
        }
    }
}

/// Where a [`TensorView`]'s values come from.
#[derive(Clone, Copy)]
pub enum TensorData<'a> {
    /// `f32`s in memory, as they are.
    Floats(&'a [f32]),
    /// Values kept in another form (an optimizer's 8-bit moments), read as `f32`s a run at a
    /// time while the snapshot is written: the tensor is never held as `f32`s whole.
    Read(&'a dyn ReadValues),
}

impl std::fmt::Debug for TensorData<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TensorData::Floats(values) => write!(f, "Floats({} values)", values.len()),
            TensorData::Read(values) => write!(f, "Read({} values)", values.len()),
        }
    }
}

/// Values a snapshot reads as `f32`s, a run at a time ([`TensorData::Read`]).
pub trait ReadValues: Sync {
    /// How many values there are.
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Writes the values from `start` on into `out`, which `start + out.len() <= len()`.
    fn read_values(&self, start: usize, out: &mut [f32]);
}

impl TensorData<'_> {
    /// How many values the tensor has.
    pub fn len(&self) -> usize {
        match self {
            TensorData::Floats(values) => values.len(),
            TensorData::Read(values) => values.len(),
        }
    }

    /// Whether the tensor has no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `each` with the values in order, runs of at most `run` at a time, with the
    /// index of the run's first value; stops at the first error.
    fn try_runs<E>(
        &self,
        run: usize,
        mut each: impl FnMut(usize, &[f32]) -> Result<(), E>,
    ) -> Result<(), E> {
        match self {
            TensorData::Floats(values) => {
                for (i, values) in values.chunks(run).enumerate() {
                    each(i * run, values)?;
                }
            }
            TensorData::Read(values) => {
                let mut buffer = vec![0.0f32; run.min(values.len())];
                let mut start = 0;
                while start < values.len() {
                    let part = &mut buffer[..run.min(values.len() - start)];
                    values.read_values(start, part);
                    each(start, part)?;
                    start += part.len();
                }
            }
        }
        Ok(())
    }

    /// The values, copied.
    pub fn to_vec(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len());
        let copied: Result<(), std::convert::Infallible> =
            self.try_runs(BUFFER / 4, |_, values| {
                out.extend_from_slice(values);
                Ok(())
            });
        match copied {
            Ok(()) => out,
        }
    }
}

/// A [`Snapshot`] whose tensors are borrowed, to encode without copying them.
#[derive(Debug, Clone)]
pub struct SnapshotView<'a> {
    /// Optimizer steps taken.
    pub step: u64,
    /// Training samples behind this state.
    pub samples: u64,
    /// The push-sum weight that goes with the parameters (1 outside SGP).
    pub push_sum_weight: f64,
    /// The swarm the state belongs to.
    pub swarm_id: &'a str,
    /// A hash of the model's definition.
    pub model_fingerprint: [u8; 32],
    /// Parameters and optimizer state.
    pub tensors: Vec<TensorView<'a>>,
}

impl Snapshot {
    /// This snapshot, borrowed.
    pub fn view(&self) -> SnapshotView<'_> {
        SnapshotView {
            step: self.step,
            samples: self.samples,
            push_sum_weight: self.push_sum_weight,
            swarm_id: &self.swarm_id,
            model_fingerprint: self.model_fingerprint,
            tensors: self
                .tensors
                .iter()
                .map(|t| TensorView::floats(&t.name, &t.data))
                .collect(),
        }
    }
}

impl SnapshotView<'_> {
    /// An owned copy, tensors included.
    pub fn to_snapshot(&self) -> Snapshot {
        Snapshot {
            step: self.step,
            samples: self.samples,
            push_sum_weight: self.push_sum_weight,
            swarm_id: self.swarm_id.to_owned(),
            model_fingerprint: self.model_fingerprint,
            tensors: self
                .tensors
                .iter()
                .map(|t| NamedTensor {
                    name: t.name.to_owned(),
                    data: t.data.to_vec(),
                })
                .collect(),
        }
    }

    /// Encodes the snapshot into memory, in a buffer of its exact length: grown as it is
    /// written instead, a buffer would hold up to twice the bytes and leave the smaller
    /// ones it outgrew to the allocator on every encode.
    pub fn encode(&self, level: i32) -> Result<Vec<u8>, SnapshotError> {
        let raw_len = self.check()?;
        let bound = SNAPSHOT_HEADER_LEN + zstd::zstd_safe::compress_bound(raw_len as usize);
        let mut out = std::io::Cursor::new(Vec::with_capacity(bound));
        self.write_checked(&mut out, level, raw_len)?;
        let mut bytes = out.into_inner();
        bytes.shrink_to_fit();
        Ok(bytes)
    }

    /// Writes the snapshot into `file` from its current position, compressing with zstd at
    /// `level`, and returns the bytes written; the file's position is then at their end.
    /// Nothing is written when the state cannot be encoded (a non-finite value, a name too
    /// long); an I/O error leaves a partial file, which fails its digest.
    pub fn write_to<F: Read + Write + Seek>(
        &self,
        file: &mut F,
        level: i32,
    ) -> Result<u64, SnapshotError> {
        let raw_len = self.check()?;
        self.write_checked(file, level, raw_len)
    }

    /// [`SnapshotView::write_to`] once [`SnapshotView::check`] has passed and given
    /// `raw_len`: the state is scanned for non-finite values once per encode.
    fn write_checked<F: Read + Write + Seek>(
        &self,
        file: &mut F,
        level: i32,
        raw_len: u64,
    ) -> Result<u64, SnapshotError> {
        let start = file.stream_position().map_err(SnapshotError::Io)?;
        file.write_all(&[0; SNAPSHOT_HEADER_LEN])
            .map_err(SnapshotError::Io)?;
        let mut counted = Counted {
            inner: &mut *file,
            written: 0,
        };
        let mut encoder =
            zstd::stream::Encoder::new(&mut counted, level).map_err(SnapshotError::Compress)?;
        self.write_raw(&mut encoder)
            .map_err(SnapshotError::Compress)?;
        encoder.finish().map_err(SnapshotError::Compress)?;
        let body_len = counted.written;
        let prefix = digested_prefix(raw_len, body_len);
        file.seek(SeekFrom::Start(start + SNAPSHOT_HEADER_LEN as u64))
            .map_err(SnapshotError::Io)?;
        let digest = hash_body(&prefix, file, body_len)?;
        file.seek(SeekFrom::Start(start))
            .map_err(SnapshotError::Io)?;
        file.write_all(&prefix).map_err(SnapshotError::Io)?;
        file.write_all(&digest).map_err(SnapshotError::Io)?;
        let len = SNAPSHOT_HEADER_LEN as u64 + body_len;
        file.seek(SeekFrom::Start(start + len))
            .map_err(SnapshotError::Io)?;
        Ok(len)
    }

    /// Checks what encoding needs and returns the uncompressed length.
    fn check(&self) -> Result<u64, SnapshotError> {
        if u8::try_from(self.swarm_id.len()).is_err() {
            return Err(SnapshotError::Malformed(
                "swarm id longer than 255 bytes".into(),
            ));
        }
        if u32::try_from(self.tensors.len()).is_err() {
            return Err(SnapshotError::Malformed("more than 2^32 tensors".into()));
        }
        let mut raw_len = (8 + 8 + 8 + 1 + self.swarm_id.len() + 32 + 4) as u64;
        for tensor in &self.tensors {
            if u16::try_from(tensor.name.len()).is_err() {
                return Err(SnapshotError::Malformed(format!(
                    "tensor name {:?}… is too long",
                    tensor.name.chars().take(16).collect::<String>()
                )));
            }
            tensor.data.try_runs(BUFFER / 4, |start, values| {
                match values.iter().position(|v| !v.is_finite()) {
                    Some(index) => Err(SnapshotError::NonFinite {
                        tensor: tensor.name.to_owned(),
                        index: start + index,
                    }),
                    None => Ok(()),
                }
            })?;
            raw_len += (2 + tensor.name.len() + 8) as u64 + 4 * tensor.data.len() as u64;
        }
        Ok(raw_len)
    }

    /// The uncompressed state, in the layout of the module docs of [`crate::snapshot`].
    fn write_raw(&self, out: &mut impl Write) -> std::io::Result<()> {
        out.write_all(&self.step.to_le_bytes())?;
        out.write_all(&self.samples.to_le_bytes())?;
        out.write_all(&self.push_sum_weight.to_le_bytes())?;
        // Lengths were checked by `check`.
        out.write_all(&[self.swarm_id.len() as u8])?;
        out.write_all(self.swarm_id.as_bytes())?;
        out.write_all(&self.model_fingerprint)?;
        out.write_all(&(self.tensors.len() as u32).to_le_bytes())?;
        let mut buffer = vec![0u8; BUFFER];
        for tensor in &self.tensors {
            out.write_all(&(tensor.name.len() as u16).to_le_bytes())?;
            out.write_all(tensor.name.as_bytes())?;
            out.write_all(&(tensor.data.len() as u64).to_le_bytes())?;
            tensor.data.try_runs(BUFFER / 4, |_, values| {
                let bytes = &mut buffer[..4 * values.len()];
                for (b, v) in bytes.chunks_exact_mut(4).zip(values) {
                    b.copy_from_slice(&v.to_le_bytes());
                }
                out.write_all(bytes)
            })?;
        }
        Ok(())
    }
}

/// Reads and checks the snapshot in `file` from its current position: the header against
/// `limits`, the digest over the whole body, then the state, decompressed as it is read.
/// Bytes after the snapshot are not read.
pub fn read_snapshot<F: Read + Seek>(
    file: &mut F,
    limits: &SnapshotLimits,
) -> Result<Snapshot, SnapshotError> {
    let start = file.stream_position().map_err(SnapshotError::Io)?;
    let mut header = [0u8; SNAPSHOT_HEADER_LEN];
    read_exact(file, &mut header, "header")?;
    let parsed = parse_header(&header, limits)?;
    let prefix = digested_prefix(parsed.raw_len, parsed.body_len);
    let digest = hash_body(&prefix, file, parsed.body_len)?;
    if digest != parsed.digest {
        return Err(SnapshotError::DigestMismatch);
    }
    file.seek(SeekFrom::Start(start + SNAPSHOT_HEADER_LEN as u64))
        .map_err(SnapshotError::Io)?;
    let body = BufReader::with_capacity(BUFFER, file.take(parsed.body_len));
    decode_body(body, parsed.raw_len, limits)
}

/// Decompresses a checked body that promises `raw_len` bytes of state, and decodes the
/// state as it comes.
pub(crate) fn decode_body<R: BufRead>(
    body: R,
    raw_len: u64,
    limits: &SnapshotLimits,
) -> Result<Snapshot, SnapshotError> {
    let decoder = zstd::stream::Decoder::with_buffer(body).map_err(SnapshotError::Decompress)?;
    // One more byte than promised may be read, to tell a longer body from an exact one.
    let mut raw = RawReader {
        inner: decoder.take(raw_len + 1),
        left: raw_len,
    };
    let snapshot = raw.snapshot(limits)?;
    if raw.left != 0 {
        return Err(SnapshotError::Malformed(format!(
            "{} trailing bytes",
            raw.left
        )));
    }
    let mut one = [0u8; 1];
    match raw.inner.read(&mut one) {
        Ok(0) => Ok(snapshot),
        Ok(_) => Err(SnapshotError::Malformed(format!(
            "body decompresses to more than the {raw_len} bytes the header says"
        ))),
        Err(e) => Err(SnapshotError::Decompress(e)),
    }
}

/// SHA-256 of `prefix` and the `len` bytes that follow in `file`.
fn hash_body<F: Read>(prefix: &[u8], file: &mut F, len: u64) -> Result<[u8; 32], SnapshotError> {
    let mut hasher = Sha256::new();
    hasher.update(prefix);
    let mut buffer = vec![0u8; BUFFER];
    let mut left = len;
    while left > 0 {
        let want = usize::try_from(left).map_or(BUFFER, |l| l.min(BUFFER));
        read_exact(file, &mut buffer[..want], "body")?;
        hasher.update(&buffer[..want]);
        left -= want as u64;
    }
    Ok(hasher.finalize().into())
}

/// `read_exact`, with an early end reported as a truncated snapshot.
fn read_exact<F: Read>(
    file: &mut F,
    buf: &mut [u8],
    what: &'static str,
) -> Result<(), SnapshotError> {
    file.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => SnapshotError::Malformed(format!(
            "truncated: the file ends inside the snapshot's {what} (a torn write or an incomplete \
             download)"
        )),
        _ => SnapshotError::Io(e),
    })
}

/// A writer that counts what passes through it.
struct Counted<'a, W> {
    inner: &'a mut W,
    written: u64,
}

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The decompressed state, read field by field; `left` is what the header promised and
/// is not read yet, so no length read from the state can make it allocate past that.
struct RawReader<R> {
    inner: R,
    left: u64,
}

impl<R: Read> RawReader<R> {
    fn snapshot(&mut self, limits: &SnapshotLimits) -> Result<Snapshot, SnapshotError> {
        let step = u64::from_le_bytes(self.array("step")?);
        let samples = u64::from_le_bytes(self.array("samples")?);
        let push_sum_weight = f64::from_le_bytes(self.array("push_sum_weight")?);
        if !push_sum_weight.is_finite() || push_sum_weight < 0.0 {
            return Err(SnapshotError::Malformed(format!(
                "push-sum weight {push_sum_weight} is not a finite non-negative number"
            )));
        }
        let [swarm_len] = self.array("swarm_id length")?;
        let swarm_id = self.text(usize::from(swarm_len), "swarm_id")?;
        let model_fingerprint = self.array("model_fingerprint")?;
        let count = u32::from_le_bytes(self.array("tensor count")?);
        if count > limits.max_tensors {
            return Err(SnapshotError::Malformed(format!(
                "{count} tensors, more than the limit of {}",
                limits.max_tensors
            )));
        }
        let mut tensors = Vec::with_capacity(count.min(64) as usize);
        for _ in 0..count {
            let name_len = u16::from_le_bytes(self.array("tensor name length")?);
            let name = self.text(usize::from(name_len), "tensor name")?;
            let elements = u64::from_le_bytes(self.array("tensor elements")?);
            let fits = elements
                .checked_mul(4)
                .is_some_and(|bytes| bytes <= self.left);
            if !fits {
                return Err(SnapshotError::Malformed(format!(
                    "tensor {name:?} claims {elements} elements, more than the bytes left"
                )));
            }
            let data = self.floats(elements as usize, &name)?;
            tensors.push(NamedTensor { name, data });
        }
        Ok(Snapshot {
            step,
            samples,
            push_sum_weight,
            swarm_id,
            model_fingerprint,
            tensors,
        })
    }

    fn fill(&mut self, buf: &mut [u8], what: &str) -> Result<(), SnapshotError> {
        if buf.len() as u64 > self.left {
            return Err(SnapshotError::Malformed(format!(
                "the state ends inside {what}"
            )));
        }
        self.inner.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => SnapshotError::Malformed(format!(
                "body decompresses to fewer bytes than the header says (ends inside {what})"
            )),
            _ => SnapshotError::Decompress(e),
        })?;
        self.left -= buf.len() as u64;
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], SnapshotError> {
        let mut out = [0u8; N];
        self.fill(&mut out, what)?;
        Ok(out)
    }

    fn text(&mut self, len: usize, what: &str) -> Result<String, SnapshotError> {
        let mut bytes = vec![0u8; len];
        self.fill(&mut bytes, what)?;
        String::from_utf8(bytes)
            .map_err(|_| SnapshotError::Malformed(format!("{what} is not UTF-8")))
    }

    /// `elements` values, checked finite; the caller checked they fit in what is left.
    fn floats(&mut self, elements: usize, tensor: &str) -> Result<Vec<f32>, SnapshotError> {
        let mut data = Vec::with_capacity(elements);
        let mut buffer = vec![0u8; BUFFER];
        while data.len() < elements {
            let n = (elements - data.len()).min(BUFFER / 4);
            let bytes = &mut buffer[..4 * n];
            self.fill(bytes, "tensor data")?;
            for b in bytes.chunks_exact(4) {
                let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                if !v.is_finite() {
                    return Err(SnapshotError::NonFinite {
                        tensor: tensor.to_owned(),
                        index: data.len(),
                    });
                }
                data.push(v);
            }
        }
        Ok(data)
    }
}
