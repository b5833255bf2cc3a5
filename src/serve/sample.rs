//! Choosing the next token from one step's logits on the host: greedy (temperature 0),
//! otherwise temperature, then top-k, then top-p (nucleus) over the softmax, drawn from a
//! per-request seeded generator so that the same request and seed give the same text.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A request's sampling settings, already checked by the API layer (temperature ≥ 0, top-p in
/// (0, 1]).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`.
    pub top_p: f32,
    pub seed: u64,
}

impl SamplingParams {
    pub fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }

    /// Whether the choice is the argmax whatever the draw: temperature 0, or top-k 1. The
    /// plan's own argmax output serves then, and no logits need to come back.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

/// One request's sampler: its settings and its random stream.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// Scratch: (token, logit) of the candidates, reused across steps.
    candidates: Vec<(u32, f32)>,
}

/// The first index of the largest non-NaN value (0 for an empty or all-NaN row), as the plans'
/// argmax picks it.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Sampler {
            params,
            rng,
            candidates: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The probabilities the draw uses, largest first: (token, probability) after temperature,
    /// top-k and top-p, summing to 1. Empty for a greedy sampler or a row with no finite
    /// logit.
    pub fn distribution(&mut self, logits: &[f32]) -> Vec<(u32, f64)> {
        if self.params.is_greedy() {
            return Vec::new();
        }
        self.candidates.clear();
        self.candidates.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(|(i, &v)| (i as u32, v)),
        );
        // Largest first; equal logits keep the lower id first (a stable order for a seed).
        self.candidates
            .sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.params.top_k > 0 {
            self.candidates.truncate(self.params.top_k);
        }
        let Some(&(_, max)) = self.candidates.first() else {
            return Vec::new();
        };
        let t = f64::from(self.params.temperature);
        let weights: Vec<f64> = self
            .candidates
            .iter()
            .map(|&(_, v)| ((f64::from(v) - f64::from(max)) / t).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut out = Vec::with_capacity(weights.len());
        let mut cumulative = 0.0;
        for (&(id, _), w) in self.candidates.iter().zip(&weights) {
            let p = w / total;
            out.push((id, p));
            cumulative += p;
            // Stop once the kept mass reaches top-p (at least one token is always kept).
            if cumulative >= f64::from(self.params.top_p) {
                break;
            }
        }
        let kept: f64 = out.iter().map(|(_, p)| p).sum();
        out.iter_mut().for_each(|(_, p)| *p /= kept);
        out
    }

    /// The next token.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let dist = self.distribution(logits);
        if dist.is_empty() {
            return argmax(logits);
        }
        let u: f64 = self.rng.random();
        let mut cumulative = 0.0;
        for &(id, p) in &dist {
            cumulative += p;
            if u < cumulative {
                return id;
            }
        }
        // Rounding left the sum a hair under 1 and u above it: the last kept token.
        dist.last().map_or(0, |&(id, _)| id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
        }
    }

    #[test]
    fn greedy_is_the_first_largest_and_skips_nan() {
        let logits = [0.5, f32::NAN, 2.0, -1.0, 2.0];
        assert_eq!(argmax(&logits), 2);
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&logits), 2);
        // top-k 1 is greedy at any temperature.
        let mut s = Sampler::new(params(5.0, 1, 1.0, 3));
        assert_eq!(s.sample(&logits), 2);
        assert_eq!(argmax(&[]), 0);
    }

    /// The distribution against softmax(logits / T) written out here, then truncated.
    #[test]
    fn distribution_is_the_tempered_softmax_cut_by_top_k_and_top_p() {
        let logits = [1.0f32, 3.0, 2.0, 0.0];
        // The sampler divides by the f32 temperature widened, not by 0.7 itself.
        let t = f64::from(0.7f32);
        let e: Vec<f64> = logits.iter().map(|&v| (f64::from(v) / t).exp()).collect();
        let z: f64 = e.iter().sum();
        let p: Vec<f64> = e.iter().map(|v| v / z).collect();
        let mut s = Sampler::new(params(0.7, 0, 1.0, 0));
        let d = s.distribution(&logits);
        let ids: Vec<u32> = d.iter().map(|x| x.0).collect();
        assert_eq!(ids, [1, 2, 0, 3]);
        for (id, q) in &d {
            assert!((q - p[*id as usize]).abs() < 1e-12);
        }
        // top-k 2: the two largest, renormalised.
        let d = Sampler::new(params(0.7, 2, 1.0, 0)).distribution(&logits);
        let z2 = p[1] + p[2];
        assert_eq!(d.len(), 2);
        assert!((d[0].1 - p[1] / z2).abs() < 1e-12 && (d[1].1 - p[2] / z2).abs() < 1e-12);
        // top-p just above the largest probability keeps two; at most it, one.
        let d = Sampler::new(params(0.7, 0, (p[1] + 1e-6) as f32, 0)).distribution(&logits);
        assert_eq!(d.len(), 2);
        let d = Sampler::new(params(0.7, 0, (p[1] - 1e-6) as f32, 0)).distribution(&logits);
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), [1]);
        // Infinite and NaN logits are never candidates.
        let d =
            Sampler::new(params(1.0, 0, 1.0, 0)).distribution(&[f32::NEG_INFINITY, 0.0, f32::NAN]);
        assert_eq!(d, [(1, 1.0)]);
    }

    #[test]
    fn a_seed_repeats_and_draws_follow_the_probabilities() {
        let logits = [0.0f32, 1.0, 2.0, -0.5];
        let draw = |seed| {
            let mut s = Sampler::new(params(1.0, 0, 1.0, seed));
            (0..4000).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        let a = draw(7);
        assert_eq!(a, draw(7));
        assert_ne!(a, draw(8));
        let e: Vec<f64> = logits.iter().map(|&v| f64::from(v).exp()).collect();
        let z: f64 = e.iter().sum();
        for (id, w) in e.iter().enumerate() {
            let want = w / z;
            let got = a.iter().filter(|&&t| t as usize == id).count() as f64 / a.len() as f64;
            // 4000 draws: a standard error under 0.008; five of them.
            assert!((got - want).abs() < 0.04, "token {id}: {got} vs {want}");
        }
    }
}
