use super::*;
use crate::state::{expect_kind, Checkpoint, StateMap, StateReader, StateReal, StateValue, StateWriter};

impl<T: StateReal> Checkpoint for OnlineEm<T> {
    const KIND: &'static str = "OnlineEM";

    fn to_state(&self) -> StateMap {
        let (d, k) = (self.n_features, self.n_components);
        let mut w = StateWriter::new(Self::KIND);
        w.put("n_features", StateValue::Int(d as u64));
        self.step.write_state(&mut w);
        // The logical state: pending moments applied, d_last = d (the format predates deferred moments).
        // One pass filling the three vectors (no per-row temporary: the peak memory of a save stays
        // about one copy of the state).
        let (mut mean, mut dsq_bar, mut d_last) = (Vec::with_capacity(d), Vec::with_capacity(d), Vec::with_capacity(d));
        for i in 0..d {
            let row: Advanced<T> = self.pending_moments(i);
            mean.push(row.mean.0);
            dsq_bar.push(row.dsq.0);
            d_last.push(T::from_f64(row.d));
        }
        w.owned_array("mean", vec![d], mean);
        w.owned_array("a_bar", vec![d, k], self.layout.to_rows(&self.a_bar, d, k));
        w.owned_array("dsq_bar", vec![d], dsq_bar);
        w.owned_array("d_last", vec![d], d_last);
        if matches!(self.step.basis, Basis::Initial) {
            w.array("init_loadings", vec![d, k], &self.init);
        }
        w.0
    }

    fn from_state(state: &StateMap) -> Result<Self> {
        expect_kind(state, Self::KIND)?;
        let r = StateReader(state);
        let d = r.usize("n_features")?;
        let step = EmStep::read_state::<T>(&r, d)?;
        let k = step.n_components;
        let init = match step.basis {
            Basis::Initial => r.array::<T>("init_loadings", &[d, k])?,
            _ => Vec::new(),
        };
        let (isa, mut a_bar) = (Isa::detect(), r.array::<T>("a_bar", &[d, k])?);
        let layout = super::layout_for::<T>(k, isa);
        layout.arrange(&mut a_bar, d, k);
        let em = OnlineEm {
            n_features: d,
            n_components: k,
            step,
            mean: r.array::<T>("mean", &[d])?,
            a_bar,
            dsq_bar: r.array::<T>("dsq_bar", &[d])?,
            d_last: r.array::<T>("d_last", &[d])?,
            init,
            isa,
            layout,
            report_cache: Default::default(),
        };
        super::checks::check_state(&em)?;
        Ok(em)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::{fill_standard_normal, orthonormal_loadings};

    #[test]
    fn resume_from_state_is_bit_identical() {
        let (d, k) = (20, 2);
        let f0 = orthonormal_loadings(d, k, 1).expect("init");
        let mut x = Array2::zeros((60, d));
        fill_standard_normal(x.view_mut(), 2);
        let cfg = EmConfig {
            n_warmup: 10,
            whiten: true,
            ..EmConfig::default()
        };
        let mut a = OnlineEm::<f32>::new(d, k, f0.view(), cfg).expect("new");
        a.update(x.slice(ndarray::s![..30, ..])).expect("update");
        let mut b = OnlineEm::<f32>::from_state(&a.to_state()).expect("restore");
        assert_eq!(a.to_state(), b.to_state());
        a.update(x.slice(ndarray::s![30.., ..])).expect("update");
        b.update(x.slice(ndarray::s![30.., ..])).expect("update");
        assert_eq!(a, b);
        let mut broken = a.to_state();
        broken.insert("a_bar".into(), StateValue::F32(vec![d, k], vec![f32::NAN; d * k]));
        assert!(OnlineEm::<f32>::from_state(&broken).is_err());
        assert!(
            OnlineEm::<f64>::from_state(&a.to_state()).is_err(),
            "dtype mismatch must be rejected"
        );
    }

    #[test]
    fn resume_from_state_is_bit_identical_for_wide_k() {
        // K > MAX_K: the checkpoint is taken after warm-up, with a pending step that the wide pass applies.
        let (d, k) = (70, 20);
        let f0 = orthonormal_loadings(d, k, 5).expect("init");
        let mut x = Array2::zeros((40, d));
        fill_standard_normal(x.view_mut(), 6);
        for whiten in [false, true] {
            let cfg = EmConfig {
                n_warmup: 22,
                whiten,
                ..EmConfig::default()
            };
            let mut a = OnlineEm::<f32>::new(d, k, f0.view(), cfg.clone()).expect("new");
            a.update(x.slice(ndarray::s![..30, ..])).expect("update");
            assert!(a.is_fitted() && a.step.pending.is_some());
            let mut b = OnlineEm::<f32>::from_state(&a.to_state()).expect("restore");
            a.update(x.slice(ndarray::s![30.., ..])).expect("update");
            b.update(x.slice(ndarray::s![30.., ..])).expect("update");
            assert_eq!(a, b);
            let mut c = OnlineEm::<f64>::new(d, k, f0.view(), cfg).expect("new");
            c.update(x.slice(ndarray::s![..30, ..])).expect("update");
            let mut e = OnlineEm::<f64>::from_state(&c.to_state()).expect("restore");
            c.update(x.slice(ndarray::s![30.., ..])).expect("update");
            e.update(x.slice(ndarray::s![30.., ..])).expect("update");
            assert_eq!(c, e);
        }
    }

    #[test]
    fn restored_whitened_model_answers_queries_bit_identically() {
        // float64 state, so no storage rounding hides a different K×K product order after a restore.
        let (d, k) = (30, 3);
        let f0 = orthonormal_loadings(d, k, 3).expect("init");
        let mut x = Array2::zeros((80, d));
        fill_standard_normal(x.view_mut(), 4);
        let cfg = EmConfig {
            n_warmup: 10,
            whiten: true,
            ..EmConfig::default()
        };
        let mut a = OnlineEm::<f64>::new(d, k, f0.view(), cfg).expect("new");
        a.update(x.view()).expect("update");
        let b = OnlineEm::<f64>::from_state(&a.to_state()).expect("restore");
        assert_eq!(a.loadings(), b.loadings());
        assert_eq!(a.noise_variance(), b.noise_variance());
        assert_eq!(a.mean(), b.mean());
    }
}
