//! A static embedding model in process: a token-embedding matrix (safetensors) and its
//! Hugging Face tokenizer, embedding a text as the mean of its tokens' rows. This is how
//! WordLlama embeds (its `WordLlamaInference.embed`: tokens without special tokens, average
//! pooling, then normalisation): no attention, so it costs microseconds, and it cannot see word
//! order, which is what the guards are for.

use std::path::{Path, PathBuf};

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The directory has no `*.safetensors` or no `*tokenizer*.json`.
    #[error("{0}: expected one *.safetensors file and one *tokenizer*.json file")]
    Missing(PathBuf),
    /// The tokenizer file did not load.
    #[error("{path}: {why}")]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The weights are not one two-dimensional float matrix.
    #[error("{path}: {why}")]
    Weights {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

/// See the module documentation.
pub struct StaticModel {
    tokenizer: tokenizers::Tokenizer,
    /// Row-major, `rows` by `dim`.
    matrix: Vec<f32>,
    rows: usize,
    dim: usize,
}

impl std::fmt::Debug for StaticModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticModel")
            .field("rows", &self.rows)
            .field("dim", &self.dim)
            .finish_non_exhaustive()
    }
}

impl StaticModel {
    /// Loads the model in `dir`.
    pub fn load(dir: &Path) -> Result<Self, LoadError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| LoadError::Read {
                path: path.to_owned(),
                source,
            })
        };
        let listing = std::fs::read_dir(dir).map_err(|source| LoadError::Read {
            path: dir.to_owned(),
            source,
        })?;
        let mut files: Vec<PathBuf> = listing.filter_map(|e| Some(e.ok()?.path())).collect();
        files.sort();
        let named = |test: &dyn Fn(&str) -> bool| {
            files
                .iter()
                .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(test))
                .cloned()
        };
        let weights = named(&|n| n.ends_with(".safetensors"));
        let tokenizer = named(&|n| n.ends_with(".json") && n.contains("tokenizer"));
        let (Some(weights), Some(tokenizer_path)) = (weights, tokenizer) else {
            return Err(LoadError::Missing(dir.to_owned()));
        };
        let tokenizer = tokenizers::Tokenizer::from_bytes(read(&tokenizer_path)?).map_err(|e| {
            LoadError::Tokenizer {
                path: tokenizer_path,
                why: e.to_string(),
            }
        })?;
        let bytes = read(&weights)?;
        let (matrix, rows, dim) =
            matrix(&bytes).map_err(|why| LoadError::Weights { path: weights, why })?;
        Ok(StaticModel {
            tokenizer,
            matrix,
            rows,
            dim,
        })
    }

    /// The embedding's dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The mean of `text`'s token rows (not normalised); zeros for a text with no tokens.
    pub fn embed(&self, text: &str) -> Vec<f32> {
        let mut out = vec![0.0f32; self.dim];
        let Ok(encoding) = self.tokenizer.encode(text, false) else {
            return out;
        };
        let ids = encoding.get_ids();
        for &id in ids {
            let row = (id as usize).min(self.rows - 1);
            let row = &self.matrix[row * self.dim..(row + 1) * self.dim];
            out.iter_mut().zip(row).for_each(|(o, x)| *o += x);
        }
        let n = ids.len().max(1) as f32;
        out.iter_mut().for_each(|o| *o /= n);
        out
    }
}

/// The one 2-D tensor of a safetensors file as f32 (from f32, f16 or bf16).
fn matrix(bytes: &[u8]) -> Result<(Vec<f32>, usize, usize), String> {
    use safetensors::{Dtype, SafeTensors};
    let tensors = SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
    let names = tensors.names();
    let [name] = names.as_slice() else {
        return Err(format!("expected one tensor, found {}", names.len()));
    };
    let view = tensors.tensor(name).map_err(|e| e.to_string())?;
    let &[rows, dim] = view.shape() else {
        return Err(format!("expected a matrix, found shape {:?}", view.shape()));
    };
    if rows == 0 || dim == 0 {
        return Err("the matrix is empty".into());
    }
    let data = view.data();
    let values: Vec<f32> = match view.dtype() {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
            .collect(),
        other => return Err(format!("unsupported dtype {other:?}")),
    };
    Ok((values, rows, dim))
}

/// IEEE 754 half precision to single (subnormals, infinities and NaN included).
fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((h >> 10) & 0x1f);
    let fraction = f32::from(h & 0x3ff);
    match exponent {
        0 => sign * fraction * 2f32.powi(-24),
        31 if fraction == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        e => sign * (1.0 + fraction / 1024.0) * 2f32.powi(e - 15),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn half_floats_convert() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert!(f16_to_f32(0x7c00).is_infinite());
    }

    /// Writes a three-word model (`[UNK]`, `hello`, `world`; rows `[0, 0]`, `[1, 0]`,
    /// `[0, 1]`) to a fresh directory, as `f32` or `bf16`.
    pub(crate) fn tiny_model(name: &str, bf16: bool) -> PathBuf {
        use safetensors::tensor::{Dtype, TensorView};
        let dir = std::env::temp_dir().join(format!("kvgate-static-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rows = [0.0f32, 0.0, 1.0, 0.0, 0.0, 1.0];
        let (dtype, bytes): (Dtype, Vec<u8>) = if bf16 {
            let b = rows
                .iter()
                .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes());
            (Dtype::BF16, b.collect())
        } else {
            (
                Dtype::F32,
                rows.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        };
        let view = TensorView::new(dtype, vec![3, 2], &bytes).unwrap();
        let file = safetensors::serialize([("embedding", view)], None).unwrap();
        std::fs::write(dir.join("embeddings.safetensors"), file).unwrap();
        let tokenizer = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,
            "decoder":null,"model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":1,"world":2},
            "unk_token":"[UNK]"}}"#;
        std::fs::write(dir.join("tokenizer.json"), tokenizer).unwrap();
        dir
    }

    #[test]
    fn embeds_as_the_mean_of_its_token_rows() {
        for bf16 in [false, true] {
            let model = StaticModel::load(&tiny_model(&format!("mean-{bf16}"), bf16)).unwrap();
            assert_eq!(model.dim(), 2);
            assert_eq!(model.embed("hello world"), vec![0.5, 0.5]);
            assert_eq!(model.embed("hello hello"), vec![1.0, 0.0]);
            assert_eq!(model.embed("world unknown"), vec![0.0, 0.5]);
            assert_eq!(model.embed(""), vec![0.0, 0.0]);
        }
    }

    #[test]
    fn a_directory_without_the_files_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("kvgate-static-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = StaticModel::load(&dir).unwrap_err().to_string();
        assert!(err.contains("expected one *.safetensors file"), "{err}");
    }

    /// Run with `KVGATE_STATIC_EMBEDDER=<dir>` (see scripts/fetch-static-embedder.sh).
    #[test]
    fn loads_a_fetched_model_when_one_is_given() {
        let Ok(dir) = std::env::var("KVGATE_STATIC_EMBEDDER") else {
            return;
        };
        let model = StaticModel::load(Path::new(&dir)).unwrap();
        assert!(model.dim() > 0);
        assert!(model.embed("hello world").iter().any(|x| *x != 0.0));
    }
}
