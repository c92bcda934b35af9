//! In-process lexical vectors for the kNN scorer when no embedder is configured: hashed TF-IDF
//! (the hashing trick of Weinberger et al., 2009, over sublinear term frequency and smoothed
//! inverse document frequency as scikit-learn's `TfidfVectorizer` defines them).
//!
//! Tokens are lowercased alphanumeric words and word bigrams; every number becomes the one
//! token `<num>` (which numbers appear says little of how hard a question is, that there are
//! several says more). Each token hashes into one of `dims` buckets with a sign bit, so
//! collisions cancel on average instead of piling up.

use super::knn::normalise;
use super::DifficultyError;
use xxhash_rust::xxh3::xxh3_64;

/// A fitted vectoriser: the bucket count and each bucket's inverse document frequency.
#[derive(Clone, Debug)]
pub struct HashedTfIdf {
    idf: Vec<f32>,
}

impl HashedTfIdf {
    /// Fits the inverse document frequencies on `docs`:
    /// `idf = ln((1 + n) / (1 + df)) + 1`, `n` documents, `df` of them holding the bucket.
    pub fn fit<'a>(
        dims: usize,
        docs: impl IntoIterator<Item = &'a str>,
    ) -> Result<HashedTfIdf, DifficultyError> {
        if dims == 0 {
            return Err(DifficultyError::Zero("dims"));
        }
        let mut df = vec![0u32; dims];
        let mut n = 0u32;
        let mut seen = Vec::new();
        for doc in docs {
            n += 1;
            seen.clear();
            for_each_token(doc, |h| seen.push((h % dims as u64) as usize));
            seen.sort_unstable();
            seen.dedup();
            for &b in &seen {
                df[b] += 1;
            }
        }
        if n == 0 {
            return Err(DifficultyError::Empty("training documents"));
        }
        let idf = df
            .iter()
            .map(|&d| ((1.0 + f64::from(n)) / (1.0 + f64::from(d))).ln() as f32 + 1.0)
            .collect();
        Ok(HashedTfIdf { idf })
    }

    /// The vector's length.
    pub fn dims(&self) -> usize {
        self.idf.len()
    }

    /// `text` as a unit vector: per bucket the signed count `c` of its tokens (each token's sign
    /// is a hash bit), as `sign(c) (1 + ln |c|)` times idf; all zeros when it has no tokens.
    pub fn vector(&self, text: &str) -> Vec<f32> {
        let dims = self.idf.len() as u64;
        let mut counts = vec![0f32; self.idf.len()];
        for_each_token(text, |h| {
            counts[(h % dims) as usize] += if h >> 63 == 1 { -1.0 } else { 1.0 };
        });
        let mut v: Vec<f32> = counts
            .iter()
            .zip(&self.idf)
            .map(|(&c, &idf)| {
                if c == 0.0 {
                    0.0
                } else {
                    c.signum() * (1.0 + c.abs().ln()) * idf
                }
            })
            .collect();
        let _ = normalise(&mut v);
        v
    }
}

/// Hashes every unigram and bigram of `text`.
fn for_each_token(text: &str, mut f: impl FnMut(u64)) {
    let mut prev: Option<u64> = None;
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let h = if word.chars().all(|c| c.is_ascii_digit()) {
            xxh3_64(b"<num>")
        } else {
            xxh3_64(word.to_lowercase().as_bytes())
        };
        f(h);
        if let Some(p) = prev {
            f(xxh3_64(&[p.to_le_bytes(), h.to_le_bytes()].concat()));
        }
        prev = Some(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::difficulty::KnnScorer;

    #[test]
    fn similar_texts_are_nearer_than_unrelated_ones() {
        let docs = [
            "how many apples does Tom have left",
            "what is the capital of France",
            "translate this sentence into German",
        ];
        let tf = HashedTfIdf::fit(256, docs).unwrap();
        let cos = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let q = tf.vector("How many apples does Anna have left after 3 days?");
        assert!(cos(&q, &tf.vector(docs[0])) > cos(&q, &tf.vector(docs[1])));
        let knn = KnnScorer::new(
            1,
            docs.iter()
                .zip([1.0, 0.0, 0.0])
                .map(|(d, l)| (tf.vector(d), l)),
        )
        .unwrap();
        assert_eq!(knn.score(&q).unwrap().p, 1.0);
        assert!(tf.vector("!!!").iter().all(|x| *x == 0.0));
    }

    #[test]
    fn fitting_needs_documents_and_buckets() {
        assert!(HashedTfIdf::fit(0, ["a"]).is_err());
        assert!(HashedTfIdf::fit(8, Vec::<&str>::new()).is_err());
    }
}
