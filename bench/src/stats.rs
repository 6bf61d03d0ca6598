//! Latency statistics: sort the samples and index (nearest rank). No histograms: a run has
//! at most a few hundred thousand samples, which sort in milliseconds.

use std::time::Duration;

use serde::Serialize;

/// Percentiles of one set of samples, in milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub min_ms: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Summary {
    /// `None` for no samples (a skipped or failed measurement has no percentiles).
    pub fn of(samples: &[Duration]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted: Vec<Duration> = samples.to_vec();
        sorted.sort_unstable();
        let total: Duration = sorted.iter().sum();
        Some(Self {
            count: sorted.len(),
            min_ms: millis(sorted[0]),
            mean_ms: millis(total) / sorted.len() as f64,
            p50_ms: millis(percentile(&sorted, 50.0)),
            p90_ms: millis(percentile(&sorted, 90.0)),
            p99_ms: millis(percentile(&sorted, 99.0)),
            max_ms: millis(sorted[sorted.len() - 1]),
        })
    }

    /// One sample (a start-up time, a detection time): every percentile is that value.
    pub fn single(sample: Duration) -> Self {
        Self::of(&[sample]).unwrap_or_else(|| unreachable!("one sample is never empty"))
    }
}

/// The nearest-rank percentile of `sorted` (ascending, non-empty): the smallest sample such
/// that at least `percent`% of the samples are no larger.
pub fn percentile(sorted: &[Duration], percent: f64) -> Duration {
    assert!(!sorted.is_empty(), "percentile of no samples");
    let rank = ((percent / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// `numerator / denominator`, or `None` when the denominator is not positive.
pub fn ratio(numerator: f64, denominator: f64) -> Option<f64> {
    (denominator > 0.0 && numerator.is_finite()).then(|| numerator / denominator)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|value| Duration::from_millis(*value)).collect()
    }

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&samples, 90.0), Duration::from_millis(90));
        assert_eq!(percentile(&samples, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&samples, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&samples, 0.0), Duration::from_millis(1));
        // Few samples: p99 of three is the largest, p50 the middle one.
        let three = ms(&[3, 1, 2]);
        let mut sorted = three.clone();
        sorted.sort();
        assert_eq!(percentile(&sorted, 50.0), Duration::from_millis(2));
        assert_eq!(percentile(&sorted, 99.0), Duration::from_millis(3));
    }

    #[test]
    fn summary_sorts_and_averages() {
        let summary = Summary::of(&ms(&[40, 10, 30, 20])).unwrap();
        assert_eq!(summary.count, 4);
        assert_eq!(summary.min_ms, 10.0);
        assert_eq!(summary.max_ms, 40.0);
        assert_eq!(summary.p50_ms, 20.0);
        assert_eq!(summary.p99_ms, 40.0);
        assert!((summary.mean_ms - 25.0).abs() < 1e-9);
        assert!(Summary::of(&[]).is_none());
        assert_eq!(Summary::single(Duration::from_millis(7)).p90_ms, 7.0);
    }

    #[test]
    fn ratios_need_a_positive_denominator() {
        assert_eq!(ratio(6.0, 2.0), Some(3.0));
        assert_eq!(ratio(1.0, 0.0), None);
    }
}
