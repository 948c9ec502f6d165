use super::*;
use crate::scaling::{read_scaling, write_scaling};
use crate::schedule::{read_schedule, write_schedule};
use crate::state::{expect_kind, Checkpoint, StateMap, StateReader, StateReal, StateValue, StateWriter};

impl<T: StateReal> Checkpoint for OnlineEm<T> {
    const KIND: &'static str = "OnlineEM";

    fn to_state(&self) -> StateMap {
        let (d, k) = (self.n_features, self.n_components);
        let mut w = StateWriter::new(Self::KIND);
        w.put("n_features", StateValue::Int(d as u64));
        w.put("n_components", StateValue::Int(k as u64));
        w.put("n_warmup", StateValue::Int(self.config.n_warmup));
        w.put("noise_floor", StateValue::Float(self.config.noise_floor));
        w.put("whiten", StateValue::Bool(self.config.whiten));
        w.put("shrink", StateValue::Bool(self.config.shrink));
        write_schedule(&mut w, &self.config.step_size);
        write_scaling(&mut w, self.config.scaling, self.scale_sq);
        w.put("n_seen", StateValue::Int(self.n_seen));
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
        w.array("a_bar", vec![d, k], &self.a_bar);
        w.owned_array("dsq_bar", vec![d], dsq_bar);
        w.owned_array("d_last", vec![d], d_last);
        w.matrix("b_bar", &self.b_bar);
        w.matrix("sigma", &self.sigma);
        match &self.source {
            Source::Initial(f0) => {
                w.put("source", StateValue::Text("initial".into()));
                w.array("init_loadings", vec![d, k], f0);
            }
            Source::Stats(h_inv) => {
                w.put("source", StateValue::Text("stats".into()));
                w.matrix("h_inv", h_inv);
            }
            Source::Whitened => w.put("source", StateValue::Text("whitened".into())),
        }
        if let Some(p) = &self.pending {
            w.put("pending_rho", StateValue::Float(p.rho));
            w.vector("pending_m", &p.m);
            if let Some(t) = &p.transform {
                w.matrix("pending_transform", t);
            }
        }
        w.0
    }

    fn from_state(state: &StateMap) -> Result<Self> {
        expect_kind(state, Self::KIND)?;
        let r = StateReader(state);
        let (d, k) = (r.usize("n_features")?, r.usize("n_components")?);
        let (scaling, scale_sq) = read_scaling(&r)?;
        let config = EmConfig {
            n_warmup: r.int("n_warmup")?,
            noise_floor: r.float("noise_floor")?,
            step_size: read_schedule(&r)?,
            whiten: r.bool("whiten")?,
            scaling,
            // Checkpoints written before the option existed report the rows as stored.
            shrink: r.has("shrink") && r.bool("shrink")?,
        };
        validate_dims(d, k, config.noise_floor)
            .and_then(|_| check_floor_fits::<T>(config.noise_floor))
            .map_err(|e| FaError::InvalidState(e.to_string()))?;
        let source = match r.text("source")? {
            "initial" => Source::Initial(r.array::<T>("init_loadings", &[d, k])?),
            "stats" => Source::Stats(r.matrix("h_inv", k, k)?),
            "whitened" => Source::Whitened,
            other => return Err(FaError::InvalidState(format!("unknown source {other:?}"))),
        };
        let pending = if r.has("pending_rho") {
            let transform = if r.has("pending_transform") {
                Some(r.matrix("pending_transform", k, k)?)
            } else {
                None
            };
            Some(Pending {
                moments: None,
                rho: r.float("pending_rho")?,
                m: r.vector("pending_m", k)?,
                transform,
            })
        } else {
            None
        };
        let em = OnlineEm {
            n_features: d,
            n_components: k,
            config,
            n_seen: r.int("n_seen")?,
            mean: r.array::<T>("mean", &[d])?,
            a_bar: r.array::<T>("a_bar", &[d, k])?,
            dsq_bar: r.array::<T>("dsq_bar", &[d])?,
            d_last: r.array::<T>("d_last", &[d])?,
            b_bar: r.matrix("b_bar", k, k)?,
            sigma: r.matrix("sigma", k, k)?,
            source,
            pending,
            scale_sq,
            isa: Isa::detect(),
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
            assert!(a.is_fitted() && a.pending.is_some());
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
