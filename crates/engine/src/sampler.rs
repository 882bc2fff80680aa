//! Sampling as graph ops: the settings are data compiled into the step graph, and only the
//! chosen token id leaves the device. Filters follow mlx-lm's `make_sampler` and
//! `make_repetition_penalty`: repetition penalty on the raw logits, then top-p, min-p and
//! top-k masks on the distribution, then temperature and a categorical draw (argmax at 0).

use anyhow::{ensure, Result};
use mlxcel_core::{CompareOp, DType, GraphBuilder, HostTensor, NodeId, ReduceOp};

#[derive(Clone, Debug, PartialEq)]
pub struct SamplerSettings {
    /// 0 is greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: off).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1: off).
    pub top_p: f32,
    /// Keep tokens at least `min_p` times as likely as the most likely one (0: off).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recently seen tokens (1: off).
    pub repetition_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repetition_context: usize,
    pub seed: u64,
}

impl Default for SamplerSettings {
    fn default() -> Self {
        SamplerSettings {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repetition_context: 20,
            seed: 0,
        }
    }
}

impl SamplerSettings {
    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.temperature >= 0.0 && self.temperature.is_finite(),
            "--temp must be ≥ 0, got {}",
            self.temperature
        );
        ensure!(
            self.top_p > 0.0 && self.top_p <= 1.0,
            "--top-p must be in (0, 1], got {}",
            self.top_p
        );
        ensure!(
            (0.0..1.0).contains(&self.min_p),
            "--min-p must be in [0, 1), got {}",
            self.min_p
        );
        ensure!(
            self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite(),
            "--repetition-penalty must be > 0, got {}",
            self.repetition_penalty
        );
        ensure!(
            self.repetition_context > 0,
            "the repetition context must hold at least one token"
        );
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    pub fn uses_penalty(&self) -> bool {
        self.repetition_penalty != 1.0
    }
}

/// Runtime inputs the sampler adds to a step graph, in this order after the model's.
pub struct SamplerInputs {
    /// `u32 []`: the draw counter (random sampling only).
    pub counter: bool,
    /// `i32 [W, 1]`: recent token ids, `-1` padded (repetition penalty only).
    pub recent: bool,
}

/// `where(keep, l, -inf)`.
fn mask(b: &mut GraphBuilder, keep: NodeId, l: NodeId) -> Result<NodeId> {
    let ninf = b.scalar(f32::NEG_INFINITY, b.dtype(l));
    Ok(b.where_(keep, l, ninf)?)
}

/// Appends the sampler to `logits [1, V]`; returns the token (`u32 [1]`). The chain stays in
/// the logits' dtype (its scalars are made in it), as mlx-lm's sampler does, so a
/// single-dtype model gets a sampler without conversions.
pub fn build(b: &mut GraphBuilder, logits: NodeId, s: &SamplerSettings) -> Result<(NodeId, SamplerInputs)> {
    let vocab = b.shape(logits)[1];
    let dtype = b.dtype(logits);
    ensure!(dtype.is_float(), "the sampler needs float logits, got {dtype}");
    let mut l = logits;
    let counter = if s.is_greedy() {
        None
    } else {
        Some(b.input("sampler_counter", DType::U32, &[]))
    };
    let recent = if s.uses_penalty() {
        Some(b.input("recent_tokens", DType::I32, &[s.repetition_context, 1]))
    } else {
        None
    };
    if let Some(recent) = recent {
        // Token v was seen when some recent id equals it (the -1 padding never does); the
        // hits become 0/1 in the logits' dtype by a select, so no cast enters the chain.
        let ids: Vec<i32> = (0..vocab as i32).collect();
        let iota = b.constant(HostTensor::from_slice(&[vocab], &ids)?);
        let hits = b.compare(CompareOp::Eq, recent, iota)?; // [W, V]
        let (one, zero) = (b.scalar(1.0, dtype), b.scalar(0.0, dtype));
        let hits = b.where_(hits, one, zero)?;
        let seen = b.reduce(ReduceOp::Max, hits, 0, true)?; // [1, V]
        let half = b.scalar(0.5, dtype);
        let seen = b.compare(CompareOp::Gt, seen, half)?;
        let negative = b.compare(CompareOp::Lt, l, zero)?;
        let up = b.mul_scalar(l, s.repetition_penalty)?;
        let down = b.mul_scalar(l, 1.0 / s.repetition_penalty)?;
        let penalized = b.where_(negative, up, down)?;
        l = b.where_(seen, penalized, l)?;
    }
    if s.top_p < 1.0 {
        // Sorted descending, a token stays if the mass before it is below top_p; the kept
        // set is every token at or above the smallest kept logit.
        let order = b.argsort(l, true)?;
        let sorted = b.take_along_axis(l, order, -1)?;
        let probs = b.softmax(sorted, -1)?;
        let cum = b.cumsum(probs, -1, false)?;
        let before = b.sub(cum, probs)?;
        let p = b.scalar(s.top_p, dtype);
        let keep = b.compare(CompareOp::Lt, before, p)?;
        let inf = b.scalar(f32::INFINITY, dtype);
        let kept = b.where_(keep, sorted, inf)?;
        let threshold = b.reduce(ReduceOp::Min, kept, -1, true)?;
        let keep = b.compare(CompareOp::Ge, l, threshold)?;
        l = mask(b, keep, l)?;
    }
    if s.min_p > 0.0 {
        let top = b.reduce(ReduceOp::Max, l, -1, true)?;
        let threshold = b.add_scalar(top, s.min_p.ln())?;
        let keep = b.compare(CompareOp::Ge, l, threshold)?;
        l = mask(b, keep, l)?;
    }
    if s.top_k > 0 && s.top_k < vocab {
        let idx = b.topk(l, s.top_k)?;
        let vals = b.take_along_axis(l, idx, -1)?;
        let kth = b.reduce(ReduceOp::Min, vals, -1, true)?;
        let keep = b.compare(CompareOp::Ge, l, kth)?;
        l = mask(b, keep, l)?;
    }
    let token = match counter {
        None => b.argmax(l, -1)?,
        Some(counter) => {
            let l = b.mul_scalar(l, 1.0 / s.temperature)?;
            b.sample_categorical(l, counter, s.seed)?
        }
    };
    Ok((
        token,
        SamplerInputs {
            counter: counter.is_some(),
            recent: recent.is_some(),
        },
    ))
}

/// Log-probabilities of one sampled token under the model's distribution (the raw logits'
/// softmax, before temperature, masks or penalties, as OpenAI and vLLM report them).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// The `top` most likely tokens, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// [`TokenLogprobs`] of `token` in a row of logits, with the `top` most likely tokens.
pub fn logprobs(logits: &[f32], token: u32, top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    let lp = |i: usize| (logits[i] as f64 - lse) as f32;
    let mut best: Vec<usize> = (0..logits.len()).collect();
    let order = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let top = top.min(logits.len());
    if top > 0 && top < best.len() {
        best.select_nth_unstable_by(top - 1, order);
    }
    best.truncate(top);
    best.sort_by(order);
    TokenLogprobs {
        token,
        logprob: logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |_| lp(token as usize)),
        top: best.into_iter().map(|i| (i as u32, lp(i))).collect(),
    }
}

/// [`build`]'s chain on the host, for batches whose rows sample differently, in its order: repetition penalty over the last
/// `repetition_context` tokens of `history`, top-p, min-p and top-k masks, then temperature
/// and Gumbel-max with the noise of row 0, so a request draws the same tokens whichever batch
/// row it sits in (argmax at temperature 0).
pub fn sample_host(logits: &[f32], s: &SamplerSettings, counter: u32, history: &[u32]) -> u32 {
    let mut l = logits.to_vec();
    if s.uses_penalty() {
        let recent = &history[history.len().saturating_sub(s.repetition_context)..];
        let mut seen = vec![false; l.len()];
        for &t in recent {
            if let Some(x) = seen.get_mut(t as usize) {
                *x = true;
            }
        }
        for (x, _) in l.iter_mut().zip(&seen).filter(|(_, &hit)| hit) {
            *x = if *x < 0.0 {
                *x * s.repetition_penalty
            } else {
                *x / s.repetition_penalty
            };
        }
    }
    if s.top_p < 1.0 {
        // Descending, a token stays while the mass before it is below top_p; the kept set is
        // every token at or above the smallest kept logit.
        let mut order: Vec<usize> = (0..l.len()).collect();
        order.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
        let top = l[order[0]];
        let total: f32 = l.iter().map(|x| (x - top).exp()).sum();
        let (mut before, mut threshold) = (0.0f32, top);
        for &j in &order {
            if before >= s.top_p {
                break;
            }
            threshold = l[j];
            before += (l[j] - top).exp() / total;
        }
        mask_below(&mut l, threshold);
    }
    if s.min_p > 0.0 {
        let top = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        mask_below(&mut l, top + s.min_p.ln());
    }
    if s.top_k > 0 && s.top_k < l.len() {
        // The k-th largest: a selection, not a sort of the whole vocabulary.
        let mut v = l.clone();
        let (_, kth, _) = v.select_nth_unstable_by(s.top_k - 1, |a, b| b.total_cmp(a));
        mask_below(&mut l, *kth);
    }
    if s.is_greedy() {
        return argmax(&l);
    }
    for (c, x) in l.iter_mut().enumerate() {
        *x = *x / s.temperature + mlxcel_core::rng::gumbel(s.seed, counter, 0, c as u32);
    }
    argmax(&l)
}

fn mask_below(l: &mut [f32], threshold: f32) {
    l.iter_mut()
        .filter(|x| **x < threshold)
        .for_each(|x| *x = f32::NEG_INFINITY);
}

/// Index of the first maximum.
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod host_tests {
    use super::*;

    /// Temperature and top-p only.
    fn draw(logits: &[f32], temperature: f32, top_p: f32, seed: u64, counter: u32) -> u32 {
        let s = SamplerSettings {
            temperature,
            top_p,
            seed,
            ..SamplerSettings::default()
        };
        sample_host(logits, &s, counter, &[])
    }

    #[test]
    fn greedy_is_the_first_maximum() {
        assert_eq!(draw(&[1.0, 3.0, 3.0, -1.0], 0.0, 1.0, 0, 0), 1);
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        // softmax(ln [0.5, 0.3, 0.15, 0.05]): top-p 0.7 keeps tokens 0 and 1 only.
        let l: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        let mut seen = [0usize; 4];
        for counter in 0..2000 {
            seen[draw(&l, 1.0, 0.7, 9, counter) as usize] += 1;
        }
        assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
        // 0.5 / 0.8 of the kept mass, roughly.
        assert!((1100..1400).contains(&seen[0]), "{seen:?}");
    }

    #[test]
    fn draws_follow_the_distribution_and_replay_from_the_seed() {
        let l: Vec<f32> = [0.6f32, 0.4].iter().map(|p| p.ln()).collect();
        let a: Vec<u32> = (0..3000).map(|c| draw(&l, 1.0, 1.0, 5, c)).collect();
        let b: Vec<u32> = (0..3000).map(|c| draw(&l, 1.0, 1.0, 5, c)).collect();
        assert_eq!(a, b);
        let ones = a.iter().filter(|&&t| t == 1).count();
        assert!((1050..1350).contains(&ones), "{ones}");
    }

    #[test]
    fn top_k_and_min_p_keep_only_the_likely_tokens() {
        let l: Vec<f32> = [0.4f32, 0.3, 0.2, 0.1].iter().map(|p| p.ln()).collect();
        let draw = |s: &SamplerSettings| -> [usize; 4] {
            let mut seen = [0usize; 4];
            for c in 0..2000 {
                seen[sample_host(&l, s, c, &[]) as usize] += 1;
            }
            seen
        };
        let base = SamplerSettings {
            temperature: 1.0,
            seed: 3,
            ..SamplerSettings::default()
        };
        let k2 = draw(&SamplerSettings {
            top_k: 2,
            ..base.clone()
        });
        assert_eq!(k2[2] + k2[3], 0, "top-k 2: {k2:?}");
        assert!(k2[0] > 0 && k2[1] > 0, "{k2:?}");
        // min-p 0.6: tokens at least 0.6 × 0.4 = 0.24 likely, so 0 and 1.
        let mp = draw(&SamplerSettings {
            min_p: 0.6,
            ..base.clone()
        });
        assert_eq!(mp[2] + mp[3], 0, "min-p 0.6: {mp:?}");
        let all = draw(&base);
        assert!(all.iter().all(|&n| n > 0), "no filter: {all:?}");
    }

    #[test]
    fn the_repetition_penalty_scales_only_recent_tokens() {
        // Token 0 leads; penalized as a recent token it falls below token 1 under greedy.
        let l = [2.0f32, 1.5, -1.0, 0.0];
        let s = SamplerSettings {
            repetition_penalty: 1.5,
            repetition_context: 2,
            ..SamplerSettings::default()
        };
        assert_eq!(sample_host(&l, &s, 0, &[]), 0);
        assert_eq!(sample_host(&l, &s, 0, &[3, 0]), 1, "2 / 1.5 < 1.5");
        assert_eq!(sample_host(&l, &s, 0, &[0, 3, 2]), 0, "0 is outside the context of 2");
        // A negative logit is multiplied (made less likely), never raised.
        let neg = [-0.1f32, -0.12];
        assert_eq!(sample_host(&neg, &s, 0, &[0]), 1, "-0.15 < -0.12");
    }
    #[test]
    fn logprobs_are_the_softmax_of_the_raw_logits() {
        // ln softmax([0, ln 2, ln 2, -inf]) = [ln 1/5, ln 2/5, ln 2/5, -inf]
        let l = [0.0, 2f32.ln(), 2f32.ln(), f32::NEG_INFINITY];
        let r = logprobs(&l, 0, 3);
        assert!((r.logprob - 0.2f32.ln()).abs() < 1e-6, "{r:?}");
        assert_eq!(r.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2, 0], "ties by id");
        assert!((r.top[0].1 - 0.4f32.ln()).abs() < 1e-6);
        assert_eq!(logprobs(&l, 3, 0).logprob, f32::NEG_INFINITY);
        assert!(logprobs(&l, 1, 0).top.is_empty());
        assert_eq!(logprobs(&l, 1, 10).top.len(), 4, "at most the vocabulary");
    }
}
