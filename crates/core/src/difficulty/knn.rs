//! The kNN scorer: P(strong needed) as the similarity-weighted share of the `k` most similar
//! labelled examples that needed the strong model (RouteLLM's similarity-weighted ranking
//! router, reduced to its nearest neighbours).
//!
//! Vectors are compared by cosine similarity; the examples are normalised once, so a score is
//! one dot product per example. Weights are the similarities clamped at a small positive
//! floor, so opposite-direction neighbours count a little rather than negatively. Ties in
//! similarity keep the earlier example, so a score is the same on every run.

use super::{check_unit, DifficultyError, Score, Scorer};

/// Labelled examples and how many neighbours vote.
#[derive(Clone, Debug)]
pub struct KnnScorer {
    dims: usize,
    k: usize,
    /// Normalised vectors, one after another.
    vectors: Vec<f32>,
    labels: Vec<f64>,
}

const MIN_WEIGHT: f64 = 1e-6;

impl KnnScorer {
    /// A scorer over `examples`, each a vector and the probability that it needed the strong
    /// model (1 or 0 for a hard label).
    pub fn new(
        k: usize,
        examples: impl IntoIterator<Item = (Vec<f32>, f64)>,
    ) -> Result<KnnScorer, DifficultyError> {
        if k == 0 {
            return Err(DifficultyError::Zero("k"));
        }
        let mut scorer = KnnScorer {
            dims: 0,
            k,
            vectors: Vec::new(),
            labels: Vec::new(),
        };
        for (i, (mut v, label)) in examples.into_iter().enumerate() {
            check_unit("example label", label)?;
            if i == 0 {
                scorer.dims = v.len();
            } else if v.len() != scorer.dims {
                return Err(DifficultyError::Dimensions {
                    want: scorer.dims,
                    got: v.len(),
                });
            }
            normalise(&mut v).ok_or(DifficultyError::BadVector(i))?;
            scorer.vectors.extend_from_slice(&v);
            scorer.labels.push(label);
        }
        if scorer.labels.is_empty() {
            return Err(DifficultyError::Empty("examples"));
        }
        Ok(scorer)
    }

    /// How many examples it holds.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether it holds none (never, once built).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The examples' dimension.
    pub fn dims(&self) -> usize {
        self.dims
    }

    /// Scores `vector`; the reason names the nearest example and its similarity.
    pub fn score(&self, vector: &[f32]) -> Result<Score, DifficultyError> {
        self.score_skipping(vector, None)
    }

    /// Scores example `index`'s own vector without it (leave-one-out), so the examples can
    /// calibrate a threshold without each finding itself as its nearest neighbour.
    pub fn score_without(&self, vector: &[f32], index: usize) -> Result<Score, DifficultyError> {
        self.score_skipping(vector, Some(index))
    }

    fn score_skipping(
        &self,
        vector: &[f32],
        skip: Option<usize>,
    ) -> Result<Score, DifficultyError> {
        if vector.len() != self.dims {
            return Err(DifficultyError::Dimensions {
                want: self.dims,
                got: vector.len(),
            });
        }
        let mut query = vector.to_vec();
        normalise(&mut query).ok_or(DifficultyError::BadVector(0))?;
        // Lexical vectors are mostly zeros: the dot product runs over the query's non-zeros.
        let nonzero: Vec<(usize, f64)> = query
            .iter()
            .enumerate()
            .filter(|(_, x)| **x != 0.0)
            .map(|(i, x)| (i, f64::from(*x)))
            .collect();
        // (similarity, index), best first; earlier index wins ties.
        let mut best: Vec<(f64, usize)> = Vec::with_capacity(self.k + 1);
        for (i, v) in self.vectors.chunks_exact(self.dims).enumerate() {
            if skip == Some(i) {
                continue;
            }
            let sim: f64 = nonzero.iter().map(|&(j, q)| q * f64::from(v[j])).sum();
            let at = best.partition_point(|&(s, _)| s >= sim);
            if at < self.k {
                best.insert(at, (sim, i));
                best.truncate(self.k);
            }
        }
        let (mut num, mut den) = (0.0, 0.0);
        for &(sim, i) in &best {
            let w = sim.max(MIN_WEIGHT);
            num += w * self.labels[i];
            den += w;
        }
        let &(sim, nearest) = best.first().ok_or(DifficultyError::Empty("examples"))?;
        Ok(Score {
            p: (num / den).clamp(0.0, 1.0),
            scorer: Scorer::Knn,
            reason: format!("nearest #{nearest} cos {sim:.3}"),
        })
    }
}

/// Scales `v` to unit length; `None` when it has no direction.
pub(crate) fn normalise(v: &mut [f32]) -> Option<()> {
    let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    if !(norm.is_finite() && norm > 0.0) {
        return None;
    }
    for x in v.iter_mut() {
        *x = (f64::from(*x) / norm) as f32;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn neighbours_vote_by_similarity() {
        let knn = KnnScorer::new(
            2,
            [
                (vec![1.0, 0.0], 1.0),
                (vec![0.9, 0.1], 1.0),
                (vec![0.0, 1.0], 0.0),
            ],
        )
        .unwrap();
        assert!(knn.score(&[1.0, 0.05]).unwrap().p > 0.99);
        let s = knn.score(&[0.0, 3.0]).unwrap();
        assert!(s.p < 0.2, "{s:?}");
        assert!(s.reason.starts_with("nearest #2"), "{s:?}");
    }

    #[test]
    fn bad_inputs_are_refused() {
        assert_eq!(
            KnnScorer::new(0, [(vec![1.0], 1.0)]).unwrap_err(),
            DifficultyError::Zero("k")
        );
        assert!(KnnScorer::new(1, Vec::<(Vec<f32>, f64)>::new()).is_err());
        assert!(KnnScorer::new(1, [(vec![1.0], 1.0), (vec![1.0, 2.0], 0.0)]).is_err());
        assert!(KnnScorer::new(1, [(vec![0.0], 1.0)]).is_err());
        assert!(KnnScorer::new(1, [(vec![1.0], 2.0)]).is_err());
        let knn = KnnScorer::new(1, [(vec![1.0, 0.0], 1.0)]).unwrap();
        assert!(knn.score(&[1.0]).is_err());
        assert!(knn.score(&[0.0, 0.0]).is_err());
        assert!(
            knn.score_without(&[1.0, 0.0], 0).is_err(),
            "no example left"
        );
    }

    #[test]
    fn leave_one_out_skips_the_example_itself() {
        let knn = KnnScorer::new(1, [(vec![1.0, 0.0], 1.0), (vec![0.8, 0.2], 0.0)]).unwrap();
        assert_eq!(knn.score(&[1.0, 0.0]).unwrap().p, 1.0);
        assert_eq!(knn.score_without(&[1.0, 0.0], 0).unwrap().p, 0.0);
    }

    proptest! {
        #[test]
        fn a_score_lies_within_the_labels(
            examples in proptest::collection::vec((proptest::collection::vec(-1.0f32..1.0, 3), 0.0f64..=1.0), 1..30),
            query in proptest::collection::vec(-1.0f32..1.0, 3),
            k in 1usize..8,
        ) {
            let examples: Vec<_> = examples.into_iter().filter(|(v, _)| v.iter().any(|x| x.abs() > 1e-3)).collect();
            prop_assume!(!examples.is_empty() && query.iter().any(|x| x.abs() > 1e-3));
            let lo = examples.iter().map(|e| e.1).fold(1.0, f64::min);
            let hi = examples.iter().map(|e| e.1).fold(0.0, f64::max);
            let knn = KnnScorer::new(k, examples).unwrap();
            let p = knn.score(&query).unwrap().p;
            prop_assert!(p >= lo - 1e-9 && p <= hi + 1e-9);
        }
    }
}
